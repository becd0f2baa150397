//! `proxy-operator run`: the operator itself.

pub use crate::operator::args::RunArgs;

/// Starts the operator and runs until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::operator::Operator::build(args).await?.run().await
}
