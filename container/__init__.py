"""The container layer: front ends that give the daemon's cards to containers (Kubernetes DRA; the device plugin
moves here later), talking to the daemon only through its public gRPC API."""
