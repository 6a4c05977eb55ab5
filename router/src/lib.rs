//! zr-router: placement, scatter/gather over QUIC and the client library (not built yet).
