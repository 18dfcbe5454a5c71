
-- What a round reserved before asking the model, per scope, until it settles: keyed
-- by the conversation, the lease token and the day it counts for. A reservation whose
-- round never settled (lease lost, stop, crash) is given back at the next claim of
-- the conversation, on its own day.
CREATE TABLE token_reservations (
    conversation_id INTEGER NOT NULL,
    lease_token     INTEGER NOT NULL,
    day             TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    tokens          INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, lease_token, day, scope)
);
