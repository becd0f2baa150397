//! Generated bindings, one module per WIT version the host accepts. Each module converts its
//! generated types into `plugins::types` and implements its imports over the version-independent
//! capabilities, so adding a version never touches the rest of the operator.

pub mod v0_1_0;
