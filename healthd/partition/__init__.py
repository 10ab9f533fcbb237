"""GPU partitioning: TDM quotas through CUDA MPS and dynamic MIG, with CDI specs, a state store and a reconciler."""
