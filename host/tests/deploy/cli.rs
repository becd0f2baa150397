//! The command line as users meet it: the completion script the binary prints completes in a
//! real bash.

/// What `proxy-operator completions bash` prints, sourced in bash: the subcommands complete, and
/// so do a subcommand's own flags (which clap_complete's script alone misses for a hyphenated
/// binary name, see `cli::command::completions`).
#[test]
fn the_bash_completion_script_completes_subcommands_and_their_flags() {
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["completions", "bash"])
        .output()
        .expect("running proxy-operator completions bash");
    assert!(script.status.success(), "{script:?}");
    let script = String::from_utf8(script.stdout).expect("UTF-8");
    let complete = |words: &[&str]| -> String {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let driver = format!(
            "COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _proxy__operator proxy-operator \"${{COMP_WORDS[COMP_CWORD]}}\" \
             \"${{COMP_WORDS[COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[*]}}\"",
            words = quoted.join(" ")
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("{script}\n{driver}")])
            .output()
            .expect("running bash");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let subcommands = complete(&["proxy-operator", ""]);
    for name in ["run", "gateway", "crds", "plugin", "completions"] {
        assert!(
            subcommands.split(' ').any(|w| w == name),
            "`proxy-operator <TAB>` offers {subcommands:?}, not {name}"
        );
    }
    assert_eq!(
        complete(&["proxy-operator", "gateway", "--discovery-u"]),
        "--discovery-url"
    );
    assert_eq!(
        complete(&["proxy-operator", "plugin", "dev-api", "--lis"]),
        "--listen"
    );
    assert!(complete(&["proxy-operator", "completions", ""]).contains("bash elvish fish"));
}
