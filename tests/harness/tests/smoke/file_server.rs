use anyhow::Result;
use harness::FileServer;
use harness::http::http_get;

#[tokio::test]
async fn serves_bytes_and_counts_requests() -> Result<()> {
    let fs = FileServer::start().await?;
    fs.serve("/images/base.qcow2", b"not really qcow2".to_vec());
    let (status, body) = http_get(fs.addr(), "/images/base.qcow2").await?;
    assert_eq!((status, body.as_str()), (200, "not really qcow2"));
    let (status, _) = http_get(fs.addr(), "/missing").await?;
    assert_eq!(status, 404);
    http_get(fs.addr(), "/images/base.qcow2?x=1").await?;
    assert_eq!(fs.requests("/images/base.qcow2"), 2);
    assert_eq!(fs.requests("/missing"), 1);
    assert!(fs.url("/a").starts_with("http://127.0.0.1:"));
    Ok(())
}
