"""The bandit study of the paper (§IX, Appendix H, Figure 14): ``recsvc eval-bandit``.

environment (rewards) → counter (private sums) and quantiles (private sensitivities) → private
(private policies) and baselines (UCB readings, Thompson) → simulate (one work unit) → run
(engine, staged output) → tables (the result), plots, report.
"""
