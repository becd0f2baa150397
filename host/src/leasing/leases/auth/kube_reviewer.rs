//! The two reviews asked of the API server: TokenReview (who is this token?) and
//! SubjectAccessReview (may this user do that?), with the operator's own identity.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::review::{Access, Review, ReviewError, Reviewer, User};

/// Reviews with a kube client (the operator's ServiceAccount needs `create` on tokenreviews
/// and subjectaccessreviews, deploy/rbac.yaml).
pub struct KubeReviewer {
    client: kube::Client,
    /// The audiences asked for (empty: the API server's own).
    audiences: Vec<String>,
}

impl KubeReviewer {
    /// `audience`: what a token must be for; empty for the API server's own audience.
    pub fn new(client: kube::Client, audience: &str) -> Self {
        KubeReviewer {
            client,
            audiences: [audience]
                .into_iter()
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }
}

impl Reviewer for KubeReviewer {
    fn review_token<'a>(&'a self, token: &'a str) -> Review<'a, Option<User>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
                },
                ..Default::default()
            };
            let answer = Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError(e.to_string()))?;
            Ok(user_of(answer.status, &self.audiences))
        })
    }

    fn review_access<'a>(&'a self, user: &'a User, access: &'a Access) -> Review<'a, bool> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: access_spec(user, access),
                ..Default::default()
            };
            let answer = Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError(e.to_string()))?;
            // An evaluation error without `allowed` is a denial, never an allow.
            Ok(answer.status.is_some_and(|s| s.allowed))
        })
    }
}

/// The user of a TokenReview's answer: authenticated, with a username, and (when audiences
/// were asked for) for one of them, as the API's documentation asks a client to check.
pub fn user_of(status: Option<TokenReviewStatus>, audiences: &[String]) -> Option<User> {
    let status = status?;
    if status.authenticated != Some(true) {
        return None;
    }
    if !audiences.is_empty()
        && !status
            .audiences
            .unwrap_or_default()
            .iter()
            .any(|a| audiences.contains(a))
    {
        return None;
    }
    let user = status.user?;
    let username = user.username.filter(|u| !u.is_empty())?;
    Some(User {
        username,
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

/// The SubjectAccessReview of `access` by `user`, with every attribute the TokenReview gave
/// (groups, uid, extra), so an authorizer sees the caller as the API server would.
pub fn access_spec(user: &User, access: &Access) -> SubjectAccessReviewSpec {
    if let Some(path) = &access.path {
        return SubjectAccessReviewSpec {
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.clone()),
                verb: Some(access.verb.into()),
            }),
            // Exactly one of the two attributes, or the API server refuses the review.
            resource_attributes: None,
            ..access_spec(
                user,
                &Access {
                    path: None,
                    ..access.clone()
                },
            )
        };
    }
    SubjectAccessReviewSpec {
        user: Some(user.username.clone()),
        uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
        groups: Some(user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes: Some(ResourceAttributes {
            verb: Some(access.verb.into()),
            group: Some(access.group.into()),
            resource: Some(access.resource.into()),
            subresource: access.subresource.map(str::to_string),
            namespace: access.namespace.clone(),
            name: access.name.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}
