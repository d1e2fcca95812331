"""What the tests share: fixtures, fakes, helpers and the servers they start.

Imported as ``support.<module>`` (``pythonpath`` in ``pyproject.toml`` puts
``tests/`` on the path); no test module imports another.
"""
