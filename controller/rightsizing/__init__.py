"""Right-sizing: per-model budget recommendations from observed usage (upsize fast, downsize slow).

Owns the rightsizing policy (`spec.rightsizing`), the usage-sample format, the decaying
histogram, the recommender (a pure function of a usage series), where a new budget fits
(in place, move, NeedsCapacity), the round-trip edit of a user's file (Recommend), the
records under decisions/ (Auto), and the Prometheus reader. Called by `gpushare rightsize`,
`gpushare usage export`, the loader (policy parsing) and the controller's right-sizing pass.
"""
