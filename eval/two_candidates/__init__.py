"""The two-candidate study (paper §V-A, Appendix D): ``recsvc eval-two-candidates``.

hg (config, exact HG table, the paper's statements) → run (staged output) → plots, report.
"""
