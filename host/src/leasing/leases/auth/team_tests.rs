use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use kube::api::ObjectMeta;
use rstest::rstest;

use super::*;
use crate::leasing::leases::auth::{Auth, AuthError, Caller};

const GOOD: &str = "3f1c9a7be2d84f6a0c5e1b9d7a3f2e8c4b6d0a1e9f7c3b5d";

fn secret(namespace: &str, type_: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("crawlers".into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                GATEWAY_CREDENTIAL_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn named(names: &[&str]) -> CredentialPools {
    CredentialPools::Named(names.iter().map(|n| n.to_string()).collect())
}

#[rstest]
#[case::one_pool("pool-a", Ok(named(&["pool-a"])))]
#[case::a_list_with_spaces(" pool-a , pool-b ", Ok(named(&["pool-a", "pool-b"])))]
#[case::own_namespace_written_out("team-a/pool-a", Ok(named(&["pool-a"])))]
#[case::every_pool("*", Ok(CredentialPools::All))]
#[case::another_namespaces_pool("team-b/pool-b", Err("is a pool of namespace team-b"))]
#[case::another_namespace_every_pool("team-b/*", Err("is a pool of namespace team-b"))]
#[case::star_in_a_list("pool-a,*", Err("`*` stands alone"))]
#[case::not_a_name("Pool_A", Err("is not a ProxyPool name"))]
#[case::empty(" , ", Err("data.pools: empty"))]
fn pools_are_of_the_secrets_own_namespace(
    #[case] pools: &str,
    #[case] want: Result<CredentialPools, &str>,
) {
    let got = parse(&secret(
        "team-a",
        GATEWAY_CREDENTIAL_TYPE,
        &[(CREDENTIAL_KEY, GOOD), (POOLS_KEY, pools)],
    ));
    match (got, want) {
        (Ok((_, credential)), Ok(pools)) => assert_eq!(credential.pools, pools),
        (Err(refusal), Err(part)) => assert!(refusal.0.contains(part), "{refusal}"),
        (got, want) => panic!("{pools}: got {got:?}, want {want:?}"),
    }
}

#[rstest]
#[case::too_short("0123456789abcdef0123456789abcde", "shorter than 32 characters")]
#[case::blank("   ", "shorter than 32 characters")]
#[case::with_a_space("0123456789abcdef 0123456789abcdef0123", "only visible ASCII")]
#[case::not_ascii("0123456789abcdef0123456789abcdefé", "only visible ASCII")]
fn a_weak_credential_is_refused_without_showing_it(#[case] value: &str, #[case] why: &str) {
    let refusal = parse(&secret(
        "team-a",
        GATEWAY_CREDENTIAL_TYPE,
        &[(CREDENTIAL_KEY, value), (POOLS_KEY, "pool-a")],
    ))
    .unwrap_err();
    assert!(refusal.0.contains(why), "{refusal}");
    assert!(refusal.0.contains("openssl rand -hex 24"), "{refusal}");
    if !value.trim().is_empty() {
        assert!(!refusal.0.contains(value.trim()), "{refusal}");
    }
}

#[test]
fn a_good_secret_makes_the_digest_of_its_credential_and_a_holder() {
    // As `kubectl create secret generic --from-file` makes it: a trailing newline.
    let with_newline = format!("{GOOD}\n");
    let (digest, credential) = parse(&secret(
        "team-a",
        GATEWAY_CREDENTIAL_TYPE,
        &[(CREDENTIAL_KEY, &with_newline), (POOLS_KEY, "pool-a")],
    ))
    .unwrap();
    assert_eq!(digest, <[u8; 32]>::from(Sha256::digest(GOOD.as_bytes())));
    assert_eq!(credential.holder, "credential:team-a/crawlers");
    assert_eq!(
        (&*credential.namespace, credential.secret.as_str()),
        ("team-a", "crawlers")
    );
}

#[rstest]
#[case::opaque("Opaque", "type: `Opaque`")]
#[case::missing_credential("", "data.credential: missing")]
fn a_labelled_secret_of_another_shape_is_refused_naming_the_field(
    #[case] type_: &str,
    #[case] why: &str,
) {
    let type_ = if type_.is_empty() {
        GATEWAY_CREDENTIAL_TYPE
    } else {
        type_
    };
    let data: &[(&str, &str)] = if why.contains("missing") {
        &[(POOLS_KEY, "pool-a")]
    } else {
        &[(CREDENTIAL_KEY, GOOD), (POOLS_KEY, "pool-a")]
    };
    let refusal = parse(&secret("team-a", type_, data)).unwrap_err();
    assert!(refusal.0.contains(why), "{refusal}");
    assert!(!refusal.0.contains(GOOD));
}

fn pool(namespace: &str, name: &str) -> PoolKey {
    PoolKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn credential(pools: CredentialPools) -> TeamCredential {
    TeamCredential {
        namespace: "team-a".into(),
        secret: "crawlers".into(),
        pools,
        holder: "credential:team-a/crawlers".into(),
    }
}

#[test]
fn a_credential_reaches_only_its_own_namespaces_pools_it_lists() {
    let (a, a2, b) = (
        pool("team-a", "pool-a"),
        pool("team-a", "pool-a2"),
        pool("team-b", "pool-a"),
    );
    let one = credential(named(&["pool-a"]));
    let two = credential(named(&["pool-a", "pool-a2"]));
    let all = credential(CredentialPools::All);
    let ns = |n: &str| Reach::Namespace(n.into());
    // (credential, scope, reach or None: refused)
    let table: Vec<(&TeamCredential, Scope, Option<Reach>)> = vec![
        (&one, Scope::Pool(&a), Some(Reach::Pool(a.clone()))),
        (&one, Scope::Pool(&a2), None),
        (&one, Scope::Pool(&b), None),
        (&one, Scope::Namespace("team-a"), None),
        (&one, Scope::Cluster, Some(Reach::Pool(a.clone()))),
        (&two, Scope::Pool(&a2), Some(Reach::Pool(a2.clone()))),
        (&two, Scope::Cluster, None),
        (&all, Scope::Pool(&a2), Some(Reach::Pool(a2.clone()))),
        (&all, Scope::Pool(&b), None),
        (&all, Scope::Namespace("team-a"), Some(ns("team-a"))),
        (&all, Scope::Namespace("team-b"), None),
        (&all, Scope::Cluster, Some(ns("team-a"))),
    ];
    for (credential, scope, want) in table {
        let got = credential.reach(&scope);
        match want {
            Some(reach) => assert_eq!(got, Ok(reach), "{:?} {scope}", credential.pools),
            None => {
                let why = got.unwrap_err();
                assert!(why.contains("team-a/crawlers"), "{why}");
                assert!(why.contains("pool-team-a.<name>"), "{why}");
            }
        }
    }
}

fn key(namespace: &str, name: &str) -> SecretKey {
    (namespace.into(), name.into())
}

fn digest(value: &str) -> TokenDigest {
    Sha256::digest(value.as_bytes()).into()
}

#[test]
fn the_book_follows_changes_deletions_and_relists() {
    let book = CredentialBook::default();
    let (old, new) = (digest("old-credential"), digest("new-credential"));
    book.set(
        key("team-a", "crawlers"),
        Some((old, credential(named(&["pool-a"])))),
    );
    assert!(matches!(book.find(&old), Found::One(c) if c.secret == "crawlers"));
    // Rotated in place: the old value stops at once.
    book.set(
        key("team-a", "crawlers"),
        Some((new, credential(named(&["pool-a"])))),
    );
    assert_eq!(book.find(&old), Found::None);
    assert!(matches!(book.find(&new), Found::One(_)));
    // Changed to something refused: gone.
    book.set(key("team-a", "crawlers"), None);
    assert_eq!(book.find(&new), Found::None);
    assert!(book.is_empty());
    // A relist forgets what it does not list.
    book.set(
        key("team-a", "crawlers"),
        Some((old, credential(CredentialPools::All))),
    );
    book.replace_all([(
        key("team-a", "other"),
        (new, credential(CredentialPools::All)),
    )]);
    assert_eq!(book.find(&old), Found::None);
    assert_eq!(book.len(), 1);
}

#[test]
fn one_credential_in_two_secrets_works_for_neither_until_one_is_gone() {
    let book = CredentialBook::default();
    let shared = digest("shared-credential");
    let mut b = credential(CredentialPools::All);
    b.namespace = "team-b".into();
    book.set(
        key("team-a", "crawlers"),
        Some((shared, credential(CredentialPools::All))),
    );
    book.set(key("team-b", "crawlers"), Some((shared, b)));
    assert!(matches!(book.find(&shared), Found::Ambiguous(s) if s.len() == 2));
    book.set(key("team-b", "crawlers"), None);
    assert!(matches!(book.find(&shared), Found::One(c) if &*c.namespace == "team-a"));
}

#[tokio::test]
async fn auth_knows_a_credential_by_its_value_and_scopes_it_before_the_table() {
    let book = std::sync::Arc::new(CredentialBook::default());
    book.set(
        key("team-a", "crawlers"),
        Some((digest(GOOD), credential(named(&["pool-a"])))),
    );
    let auth = Auth::none()
        .with_static_token("static-token", None)
        .with_credentials(book.clone());
    let caller = auth.authenticate(Some(GOOD)).await.unwrap();
    assert!(matches!(&caller, Caller::Credential(_)));
    assert_eq!(caller.holder(), Some("credential:team-a/crawlers"));
    let a = pool("team-a", "pool-a");
    assert_eq!(
        auth.authorize_lease(&caller, &Scope::Pool(&a))
            .await
            .unwrap(),
        Reach::Pool(a.clone())
    );
    let b = pool("team-b", "pool-b");
    assert!(matches!(
        auth.authorize_lease(&caller, &Scope::Pool(&b)).await,
        Err(AuthError::Forbidden(_))
    ));
    assert!(matches!(
        auth.authorize_list(&caller).await,
        Err(AuthError::Forbidden(_))
    ));
    // The static token is still itself; a deleted credential is nobody.
    assert!(matches!(
        auth.authenticate(Some("static-token")).await,
        Ok(Caller::StaticToken)
    ));
    book.set(key("team-a", "crawlers"), None);
    let refused = auth.authenticate(Some(GOOD)).await.unwrap_err();
    assert!(
        matches!(&refused, AuthError::Unauthenticated(d) if d.contains("gateway credential") && !d.contains(GOOD)),
        "{refused:?}"
    );
}
