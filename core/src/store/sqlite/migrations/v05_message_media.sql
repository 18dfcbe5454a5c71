
-- Media sent with a message (photos, image files, voice notes, audio): the platform's
-- durable references as a JSON array (see `store::encode_media`), stored with the
-- message in the same transaction; NULL for text. The bytes are fetched when the reply is generated.
ALTER TABLE messages ADD COLUMN media TEXT;
-- The transcript of a voice note or audio file: written once, under the round's lease,
-- and never transcribed again (it enters history as text).
ALTER TABLE messages ADD COLUMN transcript TEXT;
