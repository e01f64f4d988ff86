"""Reading the inputs: the GitOps repository layout, its one reader, and the pure parsers.

git → validate: `layout` names the folders, `reader` reads a checked-out tree (the
only file I/O of the stage) into the two values of `tree` (the Tree and the LastPass
it holds), `load` parses documents into typed inputs with one InputError per problem,
`compositions` and `rightsizing_records` parse those documents, `yamlin` reads YAML
fast and safely.
"""
