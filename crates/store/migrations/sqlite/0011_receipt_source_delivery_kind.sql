-- One source-agnostic entry (issue #10): where a receipt came from (`receipts.source`, tb_core
-- ReceiptSource: webhook | capability | api | schedule | queue | form) and what a delivery is for
-- (`deliveries.kind`, tb_core DeliveryKind: binding | api_run | capability_signal | outbound_webhook),
-- as typed columns instead of being told apart by the shape of reused id columns. Every writer names
-- both; the defaults only keep a row written by an older build valid.
ALTER TABLE receipts ADD COLUMN source TEXT NOT NULL DEFAULT 'webhook';
ALTER TABLE deliveries ADD COLUMN kind TEXT NOT NULL DEFAULT 'binding';

-- Backfill from the encoding before this version: an API run's receipt and delivery carry the
-- pseudo-subscription `api`; a capability endpoint's carry the endpoint id (`sgep_...`); an outbound
-- webhook delivery has action `webhook` (its receipt_id is a run event id, its subscription_id the
-- webhook id). Everything else came through the webhook front end and was routed by a binding.
UPDATE receipts SET source = 'api' WHERE subscription_id = 'api';
UPDATE receipts SET source = 'capability' WHERE substr(subscription_id, 1, 5) = 'sgep_';
UPDATE deliveries SET kind = 'outbound_webhook' WHERE action = 'webhook';
UPDATE deliveries SET kind = 'api_run' WHERE action <> 'webhook' AND subscription_id = 'api';
UPDATE deliveries SET kind = 'capability_signal'
    WHERE action <> 'webhook' AND substr(subscription_id, 1, 5) = 'sgep_';
