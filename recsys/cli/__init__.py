"""Command-line entry points (``[project.scripts]``: ``recsys-sweep``, ``recsys-train``,
``recsys-export``; ``experiments/*.py`` call the same ``main`` functions)."""
