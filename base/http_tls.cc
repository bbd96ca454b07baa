#include "base/http_tls.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace tessera::http_internal {

namespace {

std::string SubjectField(X509* cert, int nid) {
  X509_NAME* name = X509_get_subject_name(cert);
  const int index = name ? X509_NAME_get_index_by_NID(name, nid, -1) : -1;
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  const unsigned char* bytes = ASN1_STRING_get0_data(data);
  return std::string(reinterpret_cast<const char*>(bytes), static_cast<size_t>(ASN1_STRING_length(data)));
}

}  // namespace

bool SetUpTls(SSL_CTX& ctx, const std::string& cert_pem, const std::string& key_pem, const std::string& ca_pem) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  bool ok = cert != nullptr && SSL_CTX_use_certificate(&ctx, cert) == 1;
  while (ok) {  // the rest of the chain
    X509* extra = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
    if (extra == nullptr) break;
    if (SSL_CTX_add_extra_chain_cert(&ctx, extra) != 1) {
      X509_free(extra);
      ok = false;
    }
  }
  ERR_clear_error();
  X509_free(cert);
  BIO_free(cert_bio);
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  ok = ok && key != nullptr && SSL_CTX_use_PrivateKey(&ctx, key) == 1 && SSL_CTX_check_private_key(&ctx) == 1;
  EVP_PKEY_free(key);
  BIO_free(key_bio);
  if (ok && !ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(&ctx);
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    BIO* ca_bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    int loaded = 0;
    while (X509* ca = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store, ca);
      sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(ca)));
      X509_free(ca);
      ++loaded;
    }
    ERR_clear_error();
    BIO_free(ca_bio);
    SSL_CTX_set_client_CA_list(&ctx, names);
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
    ok = loaded > 0;
  }
  return ok;
}

void FillPeer(SSL* ssl, HttpRequest& out) {
  if (ssl == nullptr) return;
  X509* peer = SSL_get1_peer_certificate(ssl);
  if (peer == nullptr) return;
  if (SSL_get_verify_result(ssl) == X509_V_OK) {
    out.client_certificate = true;
    out.client_cn = SubjectField(peer, NID_commonName);
    out.client_ou = SubjectField(peer, NID_organizationalUnitName);
    if (BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(peer), nullptr)) {
      if (char* hex = BN_bn2hex(serial)) {
        out.client_serial = hex;
        OPENSSL_free(hex);
      }
      BN_free(serial);
    }
  }
  X509_free(peer);
}

}  // namespace tessera::http_internal
