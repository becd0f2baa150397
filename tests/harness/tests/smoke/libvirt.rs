use anyhow::Result;
use harness::Libvirtd;

const NS: &str = "https://proxy-operator.invalid/harness-smoke";

#[tokio::test]
async fn define_start_list_destroy_undefine_domain() -> Result<()> {
    let t = std::time::Instant::now();
    let lv = Libvirtd::start().await?;
    eprintln!("libvirtd started in {:?}", t.elapsed());
    let pools = lv.virsh_run(&["pool-list", "--name"]).await?;
    assert!(pools.lines().any(|l| l.trim() == lv.pool_name()), "{pools}");
    lv.virsh_run(&[
        "vol-create-as",
        lv.pool_name(),
        "smoke.qcow2",
        "16M",
        "--format",
        "qcow2",
    ])
    .await?;
    assert!(lv.pool_path().join("smoke.qcow2").exists());

    // No disk: it sits in SeaBIOS, which is all this needs.
    let xml = format!(
        "<domain type='qemu'>
  <name>harness-smoke</name>
  <metadata><h:instance xmlns:h='{NS}'>smoke-123</h:instance></metadata>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>"
    );
    let file = lv.dir().join("smoke-domain.xml");
    std::fs::write(&file, xml)?;
    lv.virsh_run(&["define", file.to_str().unwrap()]).await?;
    lv.virsh_run(&["start", "harness-smoke"]).await?;
    let running = lv.virsh_run(&["list", "--name"]).await?;
    assert!(
        running.lines().any(|l| l.trim() == "harness-smoke"),
        "{running}"
    );
    assert_eq!(
        lv.virsh_run(&["domstate", "harness-smoke"]).await?.trim(),
        "running"
    );
    let meta = lv.virsh_run(&["metadata", "harness-smoke", NS]).await?;
    assert!(meta.contains("smoke-123"), "{meta}");

    lv.virsh_run(&["destroy", "harness-smoke"]).await?;
    assert_eq!(
        lv.virsh_run(&["domstate", "harness-smoke"]).await?.trim(),
        "shut off"
    );
    lv.virsh_run(&["undefine", "harness-smoke"]).await?;
    let all = lv.virsh_run(&["list", "--all", "--name"]).await?;
    assert!(!all.contains("harness-smoke"), "{all}");

    let t = std::time::Instant::now();
    drop(lv);
    eprintln!("libvirtd stopped in {:?}", t.elapsed());
    Ok(())
}
