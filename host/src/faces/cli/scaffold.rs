//! `proxy-operator plugin new NAME`: a provider crate that builds to a component and passes
//! `plugin test` as generated. The templates are in `scaffold/`; rendering is pure, writing is
//! the only I/O.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Where the operator's own source keeps the SDK: the default `--sdk`. The SDK is not published
/// on crates.io, so a new crate depends on it by path.
const SDK_IN_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/sdk");

/// The operator's own lock file, written as the new crate's: the SDK's dependencies at the
/// versions this source builds and tests with, already in the local cargo cache, so the first
/// build needs no network (cargo trims the file to the crate's own dependencies).
const WORKSPACE_LOCK: &str = include_str!("../../../../Cargo.lock");

/// The flags of `plugin new`.
#[derive(Debug, Clone, clap::Args)]
pub struct NewArgs {
    /// The provider type (`describe().name`, `type` in the providers config): lowercase letters,
    /// digits and `-`, starting with a letter.
    pub name: String,
    /// The directory to create (default `./NAME`); it must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The SDK crate (`plugins/sdk` of a proxy-operator checkout); default: the one in the source
    /// this binary was built from.
    #[arg(long)]
    pub sdk: Option<PathBuf>,
    /// The instances API the generated `instance.yaml` points to (what `plugin dev-api` serves).
    #[arg(long, default_value = "http://127.0.0.1:8787")]
    pub api_url: String,
}

/// The values the templates are filled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values {
    pub name: String,
    pub sdk: String,
    pub api_url: String,
}

/// `NAME` must be a provider type: it names the component file and a ConfigMap key.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "NAME `{name}`: a provider type is 1 to 40 lowercase letters, digits and `-`, starting with a letter and not ending with `-` (e.g. `hetzner`)"
        ))
    }
}

/// `http://127.0.0.1:8787/v1` → the grant pattern `http://127.0.0.1:8787` and the listen address
/// `127.0.0.1:8787` of `plugin dev-api`.
fn origin(api_url: &str) -> Result<(String, String), String> {
    let url = url::Url::parse(api_url).map_err(|e| format!("--api-url `{api_url}`: {e}"))?;
    let host = url
        .host_str()
        .filter(|_| matches!(url.scheme(), "http" | "https"))
        .ok_or_else(|| format!("--api-url `{api_url}`: give an http:// or https:// URL"))?;
    let port = url.port_or_known_default().unwrap_or(80);
    let hostport = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    Ok((
        format!("{}://{hostport}", url.scheme()),
        format!("{host}:{port}"),
    ))
}

/// Every file of the new crate, path and text.
pub fn render(values: &Values) -> Result<Vec<(&'static str, String)>, String> {
    check_name(&values.name)?;
    let (api_origin, api_listen) = origin(&values.api_url)?;
    let krate = format!("{}-provider", values.name);
    let lib = krate.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", &values.name)
            .replace("{{crate}}", &krate)
            .replace("{{lib}}", &lib)
            .replace("{{sdk}}", &values.sdk)
            .replace("{{api_url}}", &values.api_url)
            .replace("{{api_origin}}", &api_origin)
            .replace("{{api_listen}}", &api_listen)
    };
    Ok(vec![
        ("Cargo.toml", fill(include_str!("scaffold/Cargo.toml.tmpl"))),
        ("src/lib.rs", fill(include_str!("scaffold/lib.rs.tmpl"))),
        ("src/api.rs", fill(include_str!("scaffold/api.rs.tmpl"))),
        ("README.md", fill(include_str!("scaffold/README.md.tmpl"))),
        (
            "instance.yaml",
            fill(include_str!("scaffold/instance.yaml.tmpl")),
        ),
        (".gitignore", fill(include_str!("scaffold/gitignore.tmpl"))),
        ("Cargo.lock", WORKSPACE_LOCK.to_string()),
    ])
}

/// `plugin new`: writes the crate and says what to run next.
pub fn new(args: &NewArgs) -> anyhow::Result<String> {
    check_name(&args.name).map_err(anyhow::Error::msg)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    let sdk = args
        .sdk
        .clone()
        .unwrap_or_else(|| PathBuf::from(SDK_IN_SOURCE));
    let sdk = sdk
        .canonicalize()
        .ok()
        .filter(|p| p.join("Cargo.toml").is_file());
    let Some(sdk) = sdk else {
        bail!(
            "--sdk: no SDK crate at {} (this binary's source is not here); pass --sdk PATH to plugins/sdk of a proxy-operator checkout",
            args.sdk
                .as_deref()
                .unwrap_or(Path::new(SDK_IN_SOURCE))
                .display()
        );
    };
    if dir.exists()
        && dir
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} exists and is not empty; choose another --dir or remove it",
            dir.display()
        );
    }
    let values = Values {
        name: args.name.clone(),
        sdk: sdk.display().to_string(),
        api_url: args.api_url.clone(),
    };
    let files = render(&values).map_err(anyhow::Error::msg)?;
    for (path, text) in &files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let lib = format!("{}_provider", args.name.replace('-', "_"));
    Ok(format!(
        "created {dir} (provider `{name}`)\nnext:\n  cd {dir}\n  cargo build --release --target wasm32-wasip2\n  proxy-operator plugin dev-api &\n  proxy-operator plugin test target/wasm32-wasip2/release/{lib}.wasm --config instance.yaml",
        dir = dir.display(),
        name = args.name,
    ))
}

/// `plugin new` as a command: what to run next on stdout, or the error on stderr.
pub fn command(args: &NewArgs) -> std::process::ExitCode {
    match new(args) {
        Ok(summary) => {
            println!("{summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case::simple("hetzner", true)]
    #[case::digits_and_dashes("my-cloud2", true)]
    #[case::uppercase("Hetzner", false)]
    #[case::leading_digit("2cloud", false)]
    #[case::trailing_dash("cloud-", false)]
    #[case::underscore("my_cloud", false)]
    #[case::empty("", false)]
    #[case::too_long(&"a".repeat(41), false)]
    fn provider_type_names(#[case] name: &str, #[case] valid: bool) {
        assert_eq!(check_name(name).is_ok(), valid, "{name}");
    }

    #[rstest::rstest]
    #[case::port("http://127.0.0.1:8787", "http://127.0.0.1:8787", "127.0.0.1:8787")]
    #[case::path_dropped(
        "https://api.example.com/v1",
        "https://api.example.com",
        "api.example.com:443"
    )]
    fn api_origins(#[case] url: &str, #[case] grant: &str, #[case] listen: &str) {
        assert_eq!(
            origin(url).unwrap(),
            (grant.to_string(), listen.to_string())
        );
    }

    #[test]
    fn every_placeholder_is_filled_and_the_crate_names_agree() {
        let values = Values {
            name: "my-cloud".into(),
            sdk: "/src/plugins/sdk".into(),
            api_url: "http://127.0.0.1:9000".into(),
        };
        let files = render(&values).unwrap();
        for (path, text) in &files {
            assert!(!text.contains("{{"), "{path} has an unfilled placeholder");
        }
        let file = |name: &str| &files.iter().find(|(p, _)| *p == name).unwrap().1;
        assert!(file("Cargo.toml").contains("name = \"my-cloud-provider\""));
        assert!(file("Cargo.toml").contains("path = \"/src/plugins/sdk\""));
        assert!(file("src/lib.rs").contains("pub const NAME: &str = \"my-cloud\";"));
        assert!(file("instance.yaml").contains("allow: [\"http://127.0.0.1:9000\"]"));
        assert!(file("README.md").contains("release/my_cloud_provider.wasm"));
        assert!(
            render(&Values {
                api_url: "ftp://x".into(),
                ..values
            })
            .is_err()
        );
    }
}
