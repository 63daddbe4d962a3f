"""What messages travel over: MPI or the in-process cluster (and its scheduler), the
progress engine (channels, waiting, ``Work``) and point-to-point calls."""
