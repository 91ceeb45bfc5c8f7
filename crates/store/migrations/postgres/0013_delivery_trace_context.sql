-- Issue #14: the W3C `traceparent` of the ingress span that committed a delivery's receipt, so every
-- attempt of the delivery (on any replica, also after a restart) links its span to it and passes the
-- trace on to its executor. NULL for deliveries written before this migration and for outbound webhook
-- deliveries. Same as SQLite 0019.
ALTER TABLE deliveries ADD COLUMN trace_context TEXT;
