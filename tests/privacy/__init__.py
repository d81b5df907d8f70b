"""Privacy: samplers, calibration, accounting, the kernel's checks, attacks and faults."""
