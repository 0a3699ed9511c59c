"""The data model every stage shares: ReproCase, TensorSpec, Signature, the run folder, errors."""
