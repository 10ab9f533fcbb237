"""What every container front end shares (the device plugin now, the DRA driver next): the client of the daemon's
public gRPC API, which cards are out of service (followed from the fault stream), the node inventory, and which
kubelet device a partition serves."""
