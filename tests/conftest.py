"""Shared test settings.

Hypothesis profiles: ``ci`` (default, sized for 2 cores) and ``long``
(``NUMBAEMB_LONG=1``: many more examples, for soak runs).
"""
import os

# no compile-ahead helper processes (numbaemb._ahead) in tests or the processes they
# start, so compile counts and timings are the process's own; tests/numbaemb/test_ahead.py
# turns it on where it is the subject
os.environ.setdefault("NUMBAEMB_COMPILE_AHEAD", "0")

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("long" if os.environ.get("NUMBAEMB_LONG") == "1" else "ci")

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":     # device arrays as strict as a GPU's
    from tests.cuda_support import simulate_as_tests_do
    simulate_as_tests_do()
