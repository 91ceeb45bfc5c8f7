-- RFC 0201 opt-in: a webhook that also receives Standard Webhooks headers keeps its whsec_ key in a
-- second secret file; NULL when not opted in.
ALTER TABLE webhooks ADD COLUMN standard_secret_file TEXT;
