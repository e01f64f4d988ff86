"""Planning: inputs → one decision per ElasticModel (placement and mode), and its explanation.

Pure. `cost` is the planner's view of one model (bytes from contract.footprint,
latencies from the profile), `plan` places every model, `occupancy` sums a slot,
`explain` words one decision.
"""
