-- How many deliveries a receipt was committed with (issue #10): an attempt on the only delivery of its
-- receipt settles the receipt without reading the receipt's other deliveries. NULL on receipts written
-- before this version: the attempt then reads them as before. Same as PostgreSQL 0007.
ALTER TABLE receipts ADD COLUMN deliveries INTEGER;
