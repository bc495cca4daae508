"""What runs inside each rank: process group, device, data, metrics, output."""
