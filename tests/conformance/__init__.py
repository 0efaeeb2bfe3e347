"""The engine conformance suite: one set of tests, run on every engine.

Each test takes the ``engines`` fixture (``conftest.py``), parametrised over
``memory`` and ``redis``, and holds the engine to the contract in
``gateway/engines/base.py``. The helpers the tests share (a fake clock, a message
factory, a recorder for listener calls, :class:`~tests.support.engines.Engines`) are
in :mod:`tests.support.engines`.

Two rules keep the suite fast and honest:

* Time that only decides *what* happens (expirations, delays, lease deadlines
  checked on the next call) is a :class:`FakeClock` advanced by the test.
* Time that decides *when* something happens (a waiting fetch woken by a lease
  running out) uses the real clock, limits of a fraction of ``T``, and the
  engine's own blocking ``fetch`` with a deadline: never a sleep.

Listener calls arrive later than the call that caused them (``call_soon`` for
``memory``, Redis pub/sub for ``redis``), so tests wait for them with
:meth:`Recorder.wait_for`. To show that something did *not* arrive, a test
sends a later *fence* through the same path and checks once the fence is in.
"""
