//! What `kubectl px` exits with, so a script can branch on it (docs/kubectl-plugin.md).

/// The exit codes. `2` is also what clap exits with for a command line it cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; for `why` and `status` of one object: it is Ready.
    Ok = 0,
    /// Something failed: the cluster or the discovery API unreachable, an object not found, a
    /// request refused.
    Error = 1,
    /// The command line is wrong (also a missing `--discovery-url`).
    Usage = 2,
    /// `why PROXY`, `status PROXY`, `status POOL`: the object is not Ready.
    NotReady = 3,
    /// The discovery API asked to try again later (an answer with `Retry-After`: no proxy
    /// free, the operator not ready, the named proxy leased or cooling down).
    RetryLater = 4,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// A command that did not do what it was asked: the message for stderr and the exit code.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    pub fn error(message: impl Into<String>) -> Self {
        Failure {
            exit: Exit::Error,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            exit: Exit::Usage,
            message: message.into(),
        }
    }

    /// A failed request to the API server, saying what was asked.
    pub fn kube(what: &str, error: kube::Error) -> Self {
        let message = match &error {
            kube::Error::Api(status) if status.code == 404 => format!("{what}: not found"),
            kube::Error::Api(status) if status.code == 403 => {
                format!("{what}: forbidden ({})", status.message)
            }
            _ => format!("{what}: {error}"),
        };
        Failure::error(message)
    }
}
