"""Talking to models and judging their answers: the pooled client and upstream calls, chat
rendering, answer comparison, user-given JSON Schemas and confidence bounds. A plain package
(not a Django app) that imports only core; docs/architecture.md says why it is a layer."""
