//! Talking to a running dcpid over its control socket.
