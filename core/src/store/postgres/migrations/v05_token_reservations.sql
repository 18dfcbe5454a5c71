
-- What a round reserved, per scope, until it settles; keyed by conversation, lease
-- token and day. An unsettled one is given back at the conversation's next claim.
CREATE TABLE token_reservations (
    conversation_id BIGINT NOT NULL,
    lease_token     BIGINT NOT NULL,
    day             TEXT   NOT NULL,
    scope           TEXT   NOT NULL,
    tokens          BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, lease_token, day, scope)
);
