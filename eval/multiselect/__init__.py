"""The multi-selection study: ``recsvc eval-multiselect``.

theory (``--theory``: the 1-D theory, its config and run); data (``--artifacts``: config, checks,
each test user's data) → eval (measures per user) → run (engine, report; eval.study writes it all); plots.
"""
