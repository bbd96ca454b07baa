// The TLS side of base/http_endpoint.cc: loading its certificate, key and client CA, and
// reading a verified client certificate into the request its handlers see.
// Internal to the endpoint.
#pragma once

#include <openssl/ssl.h>

#include <string>

#include "base/http_endpoint.h"

namespace tessera::http_internal {

// Loads PEM text into the context: the certificate chain, the key, and the client CA, with
// client certificates asked for but not required (the bearer token is the other way in).
// False when any of them does not load.
bool SetUpTls(SSL_CTX& ctx, const std::string& cert_pem, const std::string& key_pem, const std::string& ca_pem);

// The client certificate of a finished handshake, when it verified against the client CA:
// its CN, OU and serial into `out`. Nothing for a plaintext connection (`ssl` null).
void FillPeer(SSL* ssl, HttpRequest& out);

}  // namespace tessera::http_internal
