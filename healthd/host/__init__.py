"""The node outside the driver: where its files are (view.py), the driver's device tables (devices.py), and the
tables of a simulated node (simulated_devices.py)."""
