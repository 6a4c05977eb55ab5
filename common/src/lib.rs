//! zr-common: types shared by every zrecord process.
