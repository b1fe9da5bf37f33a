"""`recsvc eval-feature-selection`: seed 004's study of private feature selection (Swope et al.,
"Feature Selection from Differentially Private Correlations"), docs/research/feature-selection.md.

DP-SIS (the top k of |x_jᵀy| chosen by the canonical Lipschitz mechanism ``clm``) against Kifer et
al.'s two-stage baseline (Lasso supports on √N disjoint blocks, the top k of their counts chosen
privately): the non-private Figure 1, and accuracy across ε on the Fan & Lv synthetic setting and
on scikit-learn's bundled diabetes data.
"""
