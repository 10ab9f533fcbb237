"""Device and network topology: GPUs, RDMA NICs, the links between them, and best-connected card sets."""
