
-- Media references as a JSON array (`store::encode_media`), stored with the message;
-- NULL for text.
ALTER TABLE messages ADD COLUMN media TEXT;
-- The transcript of a voice note or audio file: written once, under the round's lease.
ALTER TABLE messages ADD COLUMN transcript TEXT;
