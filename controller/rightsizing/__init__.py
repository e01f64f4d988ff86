"""Right-sizing: per-model budget recommendations from observed usage (upsize fast, downsize slow).

Owns the usage-sample format, the decaying histogram, the recommender (a pure function of a
usage series), where a new budget fits (in place, move, NeedsCapacity), the round-trip edit of
a user's file (Recommend), the records it writes under decisions/ (Auto), PLAN.md's section of
open recommendations and the Prometheus reader. The policy value (`spec.rightsizing`) is
controller.policy; the records, prices and inventory are read by the one reader
(controller.inputs.reader, controller.inputs.rightsizing_records). Called by `gpushare rightsize`,
`gpushare usage export`, the reconcile pass (PLAN.md's section) and the controller's right-sizing pass.
"""
