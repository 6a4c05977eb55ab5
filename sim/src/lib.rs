//! zr-sim: the in-process cluster simulator (not built yet).
