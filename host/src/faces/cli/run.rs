//! `proxy-operator run`: the operator itself.

pub use crate::faces::operator::args::RunArgs;

/// Starts the operator and runs until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::faces::operator::Operator::build(args)
        .await?
        .run()
        .await
}
