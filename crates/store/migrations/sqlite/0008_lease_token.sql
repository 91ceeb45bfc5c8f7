-- Issue #10 (several replicas): a lease is fenced by a token minted per grant (tb_core::lease::grant).
-- Renewal, release and the attempt's commit match it; a later grant replaces it, so an earlier holder
-- (even the same worker) can write nothing about the delivery once it was leased again.
ALTER TABLE deliveries ADD COLUMN lease_token TEXT;            -- lse_<32 hex>; NULL when not leased
