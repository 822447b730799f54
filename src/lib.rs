//! The HaltSQL operator: CRD types, pure rendering and the two controllers.
