-- Issues a fencing token from the counter KEYS[1] when the pipelined acquire's INCR found it
-- missing.
return next_fencing_token()
