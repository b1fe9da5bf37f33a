"""The Appendix J study: GEM's utility bounds as predictors of its losses (:mod:`.rules`)."""
