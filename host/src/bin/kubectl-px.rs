//! `kubectl-px`: the kubectl plugin `kubectl px` (docs/kubectl-plugin.md). Everything is in the
//! library's `kubectl` module.

fn main() -> std::process::ExitCode {
    proxy_operator::faces::kubectl::main()
}
