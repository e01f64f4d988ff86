"""Rendering: decisions → the generated tree (manifests through compositions, decisions/, PLAN.md).

Pure. `compose` drives it; `compositions` selects templates, `render` runs them
sandboxed, `kube_validate` checks every object, `workerconfig` builds the worker
config, `names` makes object names, `planmd` writes PLAN.md, `yamlout` writes YAML.
"""
