// @vidjobs/client: a typed client for the vidjobs API. Zero dependencies: it needs only the platform's fetch,
// WebCrypto and streams (Node 20+, browsers, edge runtimes).
export { Vidjobs } from "./client.js";
export type {
  Export, Job, Keyed, ListJobsOptions, Page, PageOptions, Upload, UploadOptions, UsageOptions, WaitOptions,
} from "./client.js";
export { ApiError, ConnectionError, TimeoutError, UploadRejectedError, VidjobsError, WebhookVerificationError } from "./errors.js";
export type { FollowOptions, ReconnectInfo } from "./follow.js";
export { isTerminal, Transport } from "./http.js";
export type { ClientOptions, Credential, RequestOptions, ResponseInfo, RetryInfo, RetryOptions } from "./http.js";
export { decodeSecret, signWebhook, verifyWebhook } from "./webhooks.js";
export type { VerifyOptions, WebhookEvent } from "./webhooks.js";
export type * from "./types.gen.js";
