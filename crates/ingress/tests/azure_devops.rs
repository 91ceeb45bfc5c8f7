//! Azure DevOps service hooks connector (signals-and-connectors §2).
//!
//! There are no ADO fixtures in `tests/fixtures`, so the payloads are inline. Their layout follows
//! Microsoft's documented sample payloads ("Service hook events", learn.microsoft.com/azure/devops/
//! service-hooks/events) for `git.pullrequest.created`, `git.pullrequest.updated`,
//! `git.pullrequest.merged`, `ms.vss-code.git-pullrequest-comment-event`, `git.push` and
//! `build.complete`; the ids and names are this test's own.

mod common;

use serde_json::{json, Value};
use tb_core::connector::ConnectorSpec;
use trigger_bridge_ingress::azure_devops::{
    basic_authorization, check_config, pull_request_action, verify, FIELDS,
};
use trigger_bridge_ingress::{IngressError, Verified};

const USER: &str = "trigger-bridge";
const SECRET: &[u8] = b"ado-hook-password-1";
const HEADER: &str = "X-Hook-Secret";
const ADO_CT: (&str, &str) = ("content-type", "application/json; charset=utf-8");

const REPO_ID: &str = "5f0d1c2e-7a3b-4c8d-9e10-a1b2c3d4e5f6";
const PROJECT_ID: &str = "0c9e8d7f-6a5b-4c3d-2e1f-0a9b8c7d6e5f";
const CONTAINER_PROJECT_ID: &str = "4e5f6a7b-8c9d-4e0f-a1b2-c3d4e5f6a7b8";

/// The repository object ADO embeds in PR and push resources.
fn repository() -> Value {
    json!({
        "id": REPO_ID,
        "name": "payments-api",
        "url": format!("https://dev.azure.com/contoso/_apis/git/repositories/{REPO_ID}"),
        "project": {
            "id": PROJECT_ID,
            "name": "Payments",
            "url": format!("https://dev.azure.com/contoso/_apis/projects/{PROJECT_ID}"),
            "state": "wellFormed"
        },
        "defaultBranch": "refs/heads/main",
        "remoteUrl": "https://dev.azure.com/contoso/Payments/_git/payments-api"
    })
}

fn containers() -> Value {
    json!({
        "collection": { "id": "aa11bb22-cc33-dd44-ee55-ff6677889900" },
        "account": { "id": "11223344-5566-7788-99aa-bbccddeeff00" },
        "project": { "id": CONTAINER_PROJECT_ID }
    })
}

/// A pull-request resource as in the `git.pullrequest.*` samples.
fn pull_request(status: &str, merge_status: &str) -> Value {
    json!({
        "repository": repository(),
        "pullRequestId": 417,
        "status": status,
        "createdBy": {
            "id": "99887766-5544-3322-1100-ffeeddccbbaa",
            "displayName": "Dana Iverson",
            "uniqueName": "dana@contoso.example",
            "url": "https://dev.azure.com/contoso/_apis/Identities/99887766-5544-3322-1100-ffeeddccbbaa"
        },
        "creationDate": "2025-03-04T09:15:27.123456Z",
        "title": "Retry idempotent charges",
        "description": "Adds backoff to the charge client.\r\n",
        "sourceRefName": "refs/heads/feature/retry-charges",
        "targetRefName": "refs/heads/main",
        "mergeStatus": merge_status,
        "isDraft": false,
        "mergeId": "3c4d5e6f-7081-92a3-b4c5-d6e7f8091a2b",
        "lastMergeSourceCommit": {
            "commitId": "8f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6",
            "url": format!("https://dev.azure.com/contoso/_apis/git/repositories/{REPO_ID}/commits/8f1e2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6")
        },
        "reviewers": [
            { "reviewerUrl": null, "vote": 0, "id": "12121212-3434-5656-7878-909090909090",
              "displayName": "[Payments]\\Payments Team", "isContainer": true }
        ],
        "url": format!("https://dev.azure.com/contoso/_apis/git/repositories/{REPO_ID}/pullRequests/417")
    })
}

/// The service-hook envelope (§2.3) around `resource`.
fn envelope(id: &str, event_type: &str, message: &str, resource: Value) -> Value {
    json!({
        "subscriptionId": "d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6",
        "notificationId": 7,
        "id": id,
        "eventType": event_type,
        "publisherId": "tfs",
        "message": { "text": message, "html": message, "markdown": message },
        "detailedMessage": { "text": message, "html": message, "markdown": message },
        "resource": resource,
        "resourceVersion": "1.0",
        "resourceContainers": containers(),
        "createdDate": "2025-03-04T09:15:28.5Z"
    })
}

fn pr_created() -> Vec<u8> {
    let v = envelope(
        "6c2a9f4e-1b3d-4e5f-8a7b-9c0d1e2f3a4b",
        "git.pullrequest.created",
        "Dana Iverson created a new pull request",
        pull_request("active", "succeeded"),
    );
    serde_json::to_vec_pretty(&v).unwrap()
}

fn pr_updated() -> Vec<u8> {
    let v = envelope(
        "7d3b0a5f-2c4e-4f60-9b8c-0d1e2f3a4b5c",
        "git.pullrequest.updated",
        "Dana Iverson marked the pull request as completed",
        pull_request("completed", "succeeded"),
    );
    serde_json::to_vec(&v).unwrap()
}

fn pr_merged() -> Vec<u8> {
    let v = envelope(
        "8e4c1b60-3d5f-4071-8c9d-1e2f3a4b5c6d",
        "git.pullrequest.merged",
        "Dana Iverson has created a pull request merge commit",
        pull_request("active", "conflicts"),
    );
    serde_json::to_vec(&v).unwrap()
}

const COMMENT_TEXT: &str = "/deploy staging please, token=hunter2";

fn pr_comment() -> Vec<u8> {
    let resource = json!({
        "comment": {
            "id": 3,
            "parentCommentId": 1,
            "author": { "displayName": "Eli Park", "id": "abababab-cdcd-efef-0101-232323232323",
                        "uniqueName": "eli@contoso.example" },
            "content": COMMENT_TEXT,
            "publishedDate": "2025-03-04T10:01:02.3Z",
            "lastUpdatedDate": "2025-03-04T10:01:02.3Z",
            "commentType": "text",
            "_links": { "threads": { "href": format!("https://dev.azure.com/contoso/_apis/git/repositories/{REPO_ID}/pullRequests/417/threads/9") } }
        },
        "pullRequest": pull_request("active", "succeeded")
    });
    let mut v = envelope(
        "9f5d2c71-4e60-4182-9dae-2f3a4b5c6d7e",
        "ms.vss-code.git-pullrequest-comment-event",
        "Eli Park has edited a pull request comment",
        resource,
    );
    v["resourceVersion"] = json!("2.0");
    v["detailedMessage"]["text"] = json!(format!("Eli Park commented\r\n{COMMENT_TEXT}\r\n"));
    serde_json::to_vec(&v).unwrap()
}

fn git_push() -> Vec<u8> {
    let resource = json!({
        "commits": [{
            "commitId": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
            "author": { "name": "Dana Iverson", "email": "dana@contoso.example", "date": "2025-03-04T08:00:00Z" },
            "committer": { "name": "Dana Iverson", "email": "dana@contoso.example", "date": "2025-03-04T08:00:00Z" },
            "comment": "Fix retry jitter",
            "url": format!("https://dev.azure.com/contoso/_git/payments-api/commit/0a1b2c3d4e5f60718293a4b5c6d7e8f901234567")
        }],
        "refUpdates": [{
            "name": "refs/heads/main",
            "oldObjectId": "ffffffffffffffffffffffffffffffffffffffff",
            "newObjectId": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567"
        }],
        "repository": repository(),
        "pushedBy": { "id": "99887766-5544-3322-1100-ffeeddccbbaa", "displayName": "Dana Iverson",
                      "uniqueName": "dana@contoso.example" },
        "pushId": 88,
        "date": "2025-03-04T08:00:05.1Z",
        "url": format!("https://dev.azure.com/contoso/_apis/git/repositories/{REPO_ID}/pushes/88")
    });
    let v = envelope(
        "a06e3d82-5f71-4293-8ebf-3a4b5c6d7e8f",
        "git.push",
        "Dana Iverson pushed updates to branch main of repository payments-api.",
        resource,
    );
    serde_json::to_vec(&v).unwrap()
}

fn build_complete() -> Vec<u8> {
    let resource = json!({
        "id": 31337,
        "buildNumber": "20250304.4",
        "status": "completed",
        "result": "partiallySucceeded",
        "queueTime": "2025-03-04T11:00:00Z",
        "finishTime": "2025-03-04T11:07:42Z",
        "url": "https://dev.azure.com/contoso/Payments/_apis/build/Builds/31337",
        "definition": { "id": 52, "name": "payments-api CI", "type": "build", "revision": 3 },
        "project": { "id": PROJECT_ID, "name": "Payments" },
        "sourceBranch": "refs/heads/main",
        "sourceVersion": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        "reason": "individualCI",
        "requestedFor": { "displayName": "Dana Iverson", "uniqueName": "dana@contoso.example" },
        "repository": {
            "id": REPO_ID, "type": "TfsGit", "name": "payments-api",
            "url": "https://dev.azure.com/contoso/Payments/_git/payments-api",
            "clean": null, "checkoutSubmodules": false
        }
    });
    let mut v = envelope(
        "b17f4e93-6082-43a4-9fc0-4b5c6d7e8f90",
        "build.complete",
        "Build 20250304.4 partially succeeded",
        resource,
    );
    v["resourceVersion"] = json!("2.0");
    serde_json::to_vec(&v).unwrap()
}

// ---- helpers ----------------------------------------------------------------------------------------

fn basic_headers(auth: &str) -> http::HeaderMap {
    common::headers(&[ADO_CT, ("authorization", auth)])
}

/// Verifies `body` as a Basic-auth-only subscription with the right credentials.
fn basic_ok(body: &[u8]) -> Verified {
    let auth = basic_authorization(USER, SECRET);
    verify(
        Some(USER),
        None,
        SECRET,
        &basic_headers(&auth),
        body,
        &Default::default(),
    )
    .unwrap()
}

fn status<T: std::fmt::Debug>(r: Result<T, IngressError>) -> u16 {
    r.unwrap_err().code().http_status()
}

fn field<'a>(v: &'a Verified, name: &str) -> Option<&'a Value> {
    v.event.fields.get(name)
}

fn b64(raw: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(raw)
}

// ---- normalization ------------------------------------------------------------------------------------

#[test]
fn pull_request_created() {
    let v = basic_ok(&pr_created());
    assert_eq!(v.provider_event_id, "6c2a9f4e-1b3d-4e5f-8a7b-9c0d1e2f3a4b");
    assert_eq!(v.event.event, "git.pullrequest.created");
    assert_eq!(v.event.action, None);
    assert_eq!(v.event.event_type(), "git.pullrequest.created");
    let want = json!({
        "publisherId": "tfs",
        "resource.repository.id": REPO_ID,
        "resource.repository.name": "payments-api",
        "resource.repository.project.id": PROJECT_ID,
        "resource.repository.project.name": "Payments",
        "resource.pullRequestId": 417,
        "resource.status": "active",
        "resource.mergeStatus": "succeeded",
        "resource.sourceRefName": "refs/heads/feature/retry-charges",
        "resource.targetRefName": "refs/heads/main",
        "resource.isDraft": false,
        "resourceContainers.project.id": CONTAINER_PROJECT_ID,
        "pull_request.action": "created"
    });
    assert_eq!(serde_json::to_value(&v.event.fields).unwrap(), want);
}

#[test]
fn pull_request_updated_and_merged_map_the_lifecycle_action() {
    let up = basic_ok(&pr_updated());
    assert_eq!(up.provider_event_id, "7d3b0a5f-2c4e-4f60-9b8c-0d1e2f3a4b5c");
    assert_eq!(up.event.event, "git.pullrequest.updated");
    assert_eq!(up.event.action, None);
    assert_eq!(field(&up, "pull_request.action"), Some(&json!("updated")));
    assert_eq!(field(&up, "resource.status"), Some(&json!("completed")));

    let merged = basic_ok(&pr_merged());
    assert_eq!(
        merged.provider_event_id,
        "8e4c1b60-3d5f-4071-8c9d-1e2f3a4b5c6d"
    );
    assert_eq!(merged.event.event_type(), "git.pullrequest.merged");
    assert_eq!(
        field(&merged, "pull_request.action"),
        Some(&json!("merge_attempted"))
    );
    // "merged" is a merge attempt, not completion (§2.3): status and mergeStatus tell.
    assert_eq!(field(&merged, "resource.status"), Some(&json!("active")));
    assert_eq!(
        field(&merged, "resource.mergeStatus"),
        Some(&json!("conflicts"))
    );

    assert_eq!(
        pull_request_action("git.pullrequest.created"),
        Some("created")
    );
    assert_eq!(pull_request_action("git.push"), None);
}

#[test]
fn pr_comment_shares_the_pull_request_coalesce_key_and_never_carries_text() {
    let body = pr_comment();
    let v = basic_ok(&body);
    assert_eq!(v.provider_event_id, "9f5d2c71-4e60-4182-9dae-2f3a4b5c6d7e");
    assert_eq!(v.event.event, "ms.vss-code.git-pullrequest-comment-event");
    assert_eq!(v.event.action, None);
    assert_eq!(field(&v, "resource.comment.id"), Some(&json!(3)));
    // Mapped from resource.pullRequest.* so (repository id, PR id) is the same key as for PR events.
    assert_eq!(field(&v, "resource.pullRequestId"), Some(&json!(417)));
    assert_eq!(field(&v, "resource.repository.id"), Some(&json!(REPO_ID)));
    assert_eq!(
        field(&v, "resource.repository.project.id"),
        Some(&json!(PROJECT_ID))
    );
    assert_eq!(field(&v, "resource.status"), Some(&json!("active")));
    let created = basic_ok(&pr_created());
    for key in ["resource.repository.id", "resource.pullRequestId"] {
        assert_eq!(field(&v, key), field(&created, key), "{key}");
    }
    assert_eq!(field(&v, "pull_request.action"), None);
    let normalized = serde_json::to_string(&v.event).unwrap();
    assert!(!normalized.contains("hunter2"), "{normalized}");
    assert!(!normalized.contains("deploy staging"), "{normalized}");
    assert!(!normalized.contains("https://"), "{normalized}");
}

#[test]
fn git_push_fields() {
    let v = basic_ok(&git_push());
    assert_eq!(v.provider_event_id, "a06e3d82-5f71-4293-8ebf-3a4b5c6d7e8f");
    assert_eq!(v.event.event, "git.push");
    let want = json!({
        "publisherId": "tfs",
        "resource.repository.id": REPO_ID,
        "resource.repository.name": "payments-api",
        "resource.repository.project.id": PROJECT_ID,
        "resource.repository.project.name": "Payments",
        "resourceContainers.project.id": CONTAINER_PROJECT_ID
    });
    assert_eq!(serde_json::to_value(&v.event.fields).unwrap(), want);
}

#[test]
fn build_complete_fields() {
    let v = basic_ok(&build_complete());
    assert_eq!(v.provider_event_id, "b17f4e93-6082-43a4-9fc0-4b5c6d7e8f90");
    assert_eq!(v.event.event_type(), "build.complete");
    let want = json!({
        "publisherId": "tfs",
        "resource.id": 31337,
        "resource.buildNumber": "20250304.4",
        "resource.status": "completed",
        "resource.result": "partiallySucceeded",
        "resource.definition.id": 52,
        "resource.definition.name": "payments-api CI",
        "resource.repository.id": REPO_ID,
        "resource.repository.name": "payments-api",
        "resourceContainers.project.id": CONTAINER_PROJECT_ID
    });
    assert_eq!(serde_json::to_value(&v.event.fields).unwrap(), want);
}

#[test]
fn every_filled_field_is_listed_and_only_bounded_scalars_enter() {
    for body in [
        pr_created(),
        pr_updated(),
        pr_merged(),
        pr_comment(),
        git_push(),
        build_complete(),
    ] {
        let v = basic_ok(&body);
        for k in v.event.fields.keys() {
            assert!(FIELDS.contains(&k.as_str()), "{k} is not in FIELDS");
        }
    }
    let mut v: Value = serde_json::from_slice(&pr_created()).unwrap();
    v["resource"]["sourceRefName"] = json!(format!("refs/heads/{}", "x".repeat(250))); // 261 chars
    v["resource"]["targetRefName"] = json!(format!("refs/heads/{}", "y".repeat(245))); // 256 chars
    v["resource"]["mergeStatus"] = json!("succeeded\nInjected: yes");
    v["resource"]["status"] = json!({"nested": "object"});
    v["resource"]["isDraft"] = json!(true);
    v["resource"]["repository"]["name"] = json!(null);
    let got = basic_ok(&serde_json::to_vec(&v).unwrap());
    assert_eq!(
        field(&got, "resource.sourceRefName"),
        None,
        "over 256 chars is dropped"
    );
    assert_eq!(
        field(&got, "resource.targetRefName")
            .and_then(Value::as_str)
            .map(str::len),
        Some(256)
    );
    assert_eq!(
        field(&got, "resource.mergeStatus"),
        None,
        "control characters"
    );
    assert_eq!(field(&got, "resource.status"), None, "objects never enter");
    assert_eq!(
        field(&got, "resource.repository.name"),
        None,
        "null is absent"
    );
    assert_eq!(field(&got, "resource.isDraft"), Some(&json!(true)));
}

// ---- authentication -----------------------------------------------------------------------------------

#[test]
fn basic_auth_refusals_are_401_and_never_echo_the_request() {
    let body = pr_created();
    let refused = |headers: http::HeaderMap| {
        let r = verify(
            Some(USER),
            None,
            SECRET,
            &headers,
            &body,
            &Default::default(),
        );
        let e = r.clone().unwrap_err();
        let shown = e.to_string();
        for leak in ["intruder", "guess", "bearer-token-value", "!!!"] {
            assert!(!shown.contains(leak), "{shown}");
        }
        assert_eq!(status(r), 401, "{shown}");
        e
    };
    let wrong_user = basic_authorization("intruder", SECRET);
    let wrong_password = basic_authorization(USER, b"guess");
    assert_eq!(
        refused(basic_headers(&wrong_user)),
        IngressError::SignatureInvalid("Basic credentials do not match")
    );
    assert_eq!(
        refused(basic_headers(&wrong_password)),
        IngressError::SignatureInvalid("Basic credentials do not match")
    );
    assert_eq!(
        refused(common::headers(&[ADO_CT])),
        IngressError::SignatureInvalid("missing Authorization")
    );
    assert_eq!(
        refused(basic_headers("Bearer bearer-token-value")),
        IngressError::SignatureInvalid("Authorization scheme must be Basic")
    );
    assert_eq!(
        refused(basic_headers("Basic !!!not-base64!!!")),
        IngressError::SignatureInvalid("Authorization Basic credentials are not valid base64")
    );
    let no_colon = format!("Basic {}", b64(b"trigger-bridgeado-hook-password-1"));
    assert_eq!(
        refused(basic_headers(&no_colon)),
        IngressError::SignatureInvalid(
            "Authorization Basic credentials lack the user:password separator"
        )
    );
    let good = basic_authorization(USER, SECRET);
    refused(common::headers(&[
        ADO_CT,
        ("authorization", &good),
        ("authorization", &good),
    ]));
    refused(basic_headers("Basic"));
    // Prefix / suffix of the right password, and an empty password.
    refused(basic_headers(&basic_authorization(
        USER,
        b"ado-hook-password-",
    )));
    refused(basic_headers(&basic_authorization(
        USER,
        b"ado-hook-password-12",
    )));
    refused(basic_headers(&basic_authorization(USER, b"")));
    // The right credentials with the wrong secret configured.
    assert_eq!(
        status(verify(
            Some(USER),
            None,
            b"rotated",
            &basic_headers(&good),
            &body,
            &Default::default()
        )),
        401
    );
    // An empty configured secret refuses everything, even a matching empty password.
    let empty = basic_authorization(USER, b"");
    assert_eq!(
        verify(
            Some(USER),
            None,
            b"",
            &basic_headers(&empty),
            &body,
            &Default::default()
        ),
        Err(IngressError::SignatureInvalid("no secret configured"))
    );
}

#[test]
fn basic_scheme_is_case_insensitive_and_whitespace_tolerant() {
    let body = pr_created();
    let creds = b64(b"trigger-bridge:ado-hook-password-1");
    for auth in [
        format!("Basic {creds}"),
        format!("basic {creds}"),
        format!("BASIC {creds}"),
        format!("Basic   {creds}  "),
    ] {
        let r = verify(
            Some(USER),
            None,
            SECRET,
            &basic_headers(&auth),
            &body,
            &Default::default(),
        );
        assert!(r.is_ok(), "{auth:?}: {r:?}");
    }
    // The password may itself contain ':' (only the first one separates, RFC 7617).
    let auth = basic_authorization(USER, b"pa:ss");
    assert!(verify(
        Some(USER),
        None,
        b"pa:ss",
        &basic_headers(&auth),
        &body,
        &Default::default()
    )
    .is_ok());
}

#[test]
fn secret_header_mode() {
    let body = git_push();
    let ok = verify(
        None,
        Some(HEADER),
        SECRET,
        &common::headers(&[ADO_CT, ("x-hook-secret", "ado-hook-password-1")]),
        &body,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(ok.provider_event_id, "a06e3d82-5f71-4293-8ebf-3a4b5c6d7e8f");
    for headers in [
        common::headers(&[ADO_CT]),
        common::headers(&[ADO_CT, (HEADER, "wrong")]),
        common::headers(&[ADO_CT, (HEADER, "ado-hook-password-1x")]),
        common::headers(&[
            ADO_CT,
            (HEADER, "ado-hook-password-1"),
            (HEADER, "ado-hook-password-1"),
        ]),
        // Basic credentials do not stand in for the header.
        basic_headers(&basic_authorization(USER, SECRET)),
    ] {
        let r = verify(
            None,
            Some(HEADER),
            SECRET,
            &headers,
            &body,
            &Default::default(),
        );
        assert_eq!(status(r.clone()), 401, "{r:?}");
        assert!(!r.unwrap_err().to_string().contains("wrong"));
    }
}

#[test]
fn both_configured_requires_both() {
    let body = pr_created();
    let auth = basic_authorization(USER, SECRET);
    let secret = std::str::from_utf8(SECRET).unwrap();
    let both = common::headers(&[ADO_CT, ("authorization", &auth), (HEADER, secret)]);
    let v = verify(
        Some(USER),
        Some(HEADER),
        SECRET,
        &both,
        &body,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(v.provider_event_id, "6c2a9f4e-1b3d-4e5f-8a7b-9c0d1e2f3a4b");

    let basic_only = basic_headers(&auth);
    assert_eq!(
        verify(
            Some(USER),
            Some(HEADER),
            SECRET,
            &basic_only,
            &body,
            &Default::default()
        ),
        Err(IngressError::SignatureInvalid(
            "missing the configured secret header"
        ))
    );
    let header_only = common::headers(&[ADO_CT, (HEADER, secret)]);
    assert_eq!(
        verify(
            Some(USER),
            Some(HEADER),
            SECRET,
            &header_only,
            &body,
            &Default::default()
        ),
        Err(IngressError::SignatureInvalid("missing Authorization"))
    );
    let bad_header = common::headers(&[ADO_CT, ("authorization", &auth), (HEADER, "nope")]);
    assert_eq!(
        status(verify(
            Some(USER),
            Some(HEADER),
            SECRET,
            &bad_header,
            &body,
            &Default::default()
        )),
        401
    );
    // Neither configured: fail closed.
    assert_eq!(
        status(verify(
            None,
            None,
            SECRET,
            &both,
            &body,
            &Default::default()
        )),
        401
    );
}

#[test]
fn authentication_comes_before_parsing() {
    // Garbage without credentials is 401, not 422: nothing is parsed before authentication.
    assert_eq!(
        verify(
            Some(USER),
            None,
            SECRET,
            &common::headers(&[ADO_CT]),
            b"not json",
            &Default::default()
        ),
        Err(IngressError::SignatureInvalid("missing Authorization"))
    );
}

// ---- media type and body shape ------------------------------------------------------------------------

#[test]
fn compressed_or_non_json_bodies_are_415_before_authentication() {
    let body = pr_created();
    let auth = basic_authorization(USER, SECRET);
    let gzip = common::headers(&[
        ADO_CT,
        ("authorization", &auth),
        ("content-encoding", "gzip"),
    ]);
    assert_eq!(
        status(verify(
            Some(USER),
            None,
            SECRET,
            &gzip,
            &body,
            &Default::default()
        )),
        415
    );
    let gzip_no_auth = common::headers(&[ADO_CT, ("content-encoding", "gzip")]);
    assert_eq!(
        status(verify(
            Some(USER),
            None,
            SECRET,
            &gzip_no_auth,
            &body,
            &Default::default()
        )),
        415
    );
    let text = common::headers(&[("content-type", "text/plain"), ("authorization", &auth)]);
    assert_eq!(
        status(verify(
            Some(USER),
            None,
            SECRET,
            &text,
            &body,
            &Default::default()
        )),
        415
    );
    // identity encoding and an absent Content-Type are fine.
    let plain = common::headers(&[("authorization", &auth), ("content-encoding", "identity")]);
    assert!(verify(Some(USER), None, SECRET, &plain, &body, &Default::default()).is_ok());
}

#[test]
fn authentic_but_unusable_bodies_are_422() {
    let auth = basic_authorization(USER, SECRET);
    let h = basic_headers(&auth);
    let run = |v: Value| {
        verify(
            Some(USER),
            None,
            SECRET,
            &h,
            &serde_json::to_vec(&v).unwrap(),
            &Default::default(),
        )
    };
    let base: Value = serde_json::from_slice(&pr_created()).unwrap();

    let mut no_id = base.clone();
    no_id.as_object_mut().unwrap().remove("id");
    assert_eq!(
        run(no_id),
        Err(IngressError::Malformed(
            "payload has no id (the event GUID)"
        ))
    );
    let mut numeric_id = base.clone();
    numeric_id["id"] = json!(12);
    assert_eq!(status(run(numeric_id)), 422);
    let mut spaced_id = base.clone();
    spaced_id["id"] = json!("has space");
    assert_eq!(status(run(spaced_id)), 422);
    let mut no_type = base.clone();
    no_type.as_object_mut().unwrap().remove("eventType");
    assert_eq!(
        run(no_type),
        Err(IngressError::Malformed("payload has no eventType"))
    );
    let mut odd_type = base.clone();
    odd_type["eventType"] = json!("git pull request");
    assert_eq!(status(run(odd_type)), 422);
    assert_eq!(status(run(json!([1, 2]))), 422);

    // Not JSON / not UTF-8 after authentication: deterministic 422.
    for (body, why) in [
        (&b"{\"id\": "[..], "body is not valid JSON"),
        (b"\xff\xfe{}", "body is not valid UTF-8"),
        (b"{\"id\":\"\xc3\x28\"}", "body is not valid UTF-8"),
        (b"", "body is not valid JSON"),
    ] {
        assert_eq!(
            verify(Some(USER), None, SECRET, &h, body, &Default::default()),
            Err(IngressError::Malformed(why)),
            "{body:?}"
        );
    }
}

// ---- dispatch and configuration -----------------------------------------------------------------------

#[test]
fn dispatch_through_the_connector_spec() {
    let spec = ConnectorSpec::AzureDevops {
        basic_username: Some(USER.into()),
        header_name: None,
    };
    assert_eq!(trigger_bridge_ingress::normalized_fields(&spec), FIELDS);
    let auth = basic_authorization(USER, SECRET);
    let v = trigger_bridge_ingress::verify(
        &spec,
        SECRET,
        &basic_headers(&auth),
        &pr_merged(),
        0,
        &Default::default(),
    )
    .unwrap();
    assert_eq!(v.provider_event_id, "8e4c1b60-3d5f-4071-8c9d-1e2f3a4b5c6d");
    assert_eq!(
        basic_authorization("u", b"p"),
        format!("Basic {}", b64(b"u:p"))
    );
}

#[test]
fn config_checks() {
    assert!(check_config(Some("ado"), None).is_ok());
    assert!(check_config(None, Some("X-Hook-Secret")).is_ok());
    assert!(check_config(Some("ado"), Some("X-Hook-Secret")).is_ok());
    assert!(check_config(None, None)
        .unwrap_err()
        .contains("basic_username"));
    assert!(check_config(Some("a:b"), None).is_err());
    assert!(check_config(Some(""), None).is_err());
    assert!(check_config(None, Some("bad header")).is_err());
    assert!(check_config(Some("ado"), Some("Authorization")).is_err());
}
