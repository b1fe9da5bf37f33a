"""The application layer: the `recsvc` command and the demo, the only code that wires the parts
(service, data_prep, eval) together."""
