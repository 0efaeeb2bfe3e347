"""Example agents that ship with the package.

``echo_agent`` is ``examples/echo_agent.py``, byte for byte: the copy that
``asbp demo`` runs (``python -m agents.examples.echo_agent``), because an
installed package has no ``examples/`` folder beside it. The file in
``examples/`` is the one people read and copy; tests/agents/test_examples.py
fails if the two differ, so edit one and copy it over the other.
"""

__all__: list[str] = []
