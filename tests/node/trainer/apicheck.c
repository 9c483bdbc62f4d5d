/*
 * apicheck: from inside a pod on tests/node's node, makes the first request an in-cluster
 * Kubernetes client makes, the way client-go's rest.InClusterConfig does: to
 * https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (the `kubernetes` Service's
 * ClusterIP, which kube-proxy forwards to the API server), with the pod's
 * service-account token, over TLS verified against the service account's ca.crt (the
 * kube-root-ca.crt ConfigMap). The server's certificate must name both the ClusterIP and
 * kubernetes.default.svc (the name other clients use; it is also sent as SNI).
 *
 *   apicheck [--path /api] [--timeout SECONDS] [--merge-patch JSON]
 *
 * Prints the request and the response's status line, and exits 0 on 200, 1 otherwise.
 * With --merge-patch, the request is a PATCH of --path with that JSON merge patch (say,
 * an annotation of a pod), and the line also gives the "message" of the response's
 * Status, where it has one (a 403's reason). It retries connecting until the timeout
 * (default 30 s): a pod can start before kube-proxy has written the Service's rules.
 *
 * Linked statically with OpenSSL, so the trainer image needs no libraries.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define SERVER_NAME "kubernetes.default.svc"

static void die(const char *msg, const char *detail)
{
	fprintf(stderr, "apicheck: error: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
	exit(1);
}

static char *slurp(const char *path)
{
	static char buf[16384];
	FILE *f = fopen(path, "r");
	if (!f)
		die("cannot read", path);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	return strdup(buf);
}

/* The value of the first "message" string in a JSON text, unescaped (ASCII), or NULL. */
static char *json_message(const char *json)
{
	const char *p = strstr(json, "\"message\":\"");
	if (!p)
		return NULL;
	p += strlen("\"message\":\"");
	char *out = malloc(strlen(p) + 1), *o = out;
	for (; *p && *p != '"'; p++) {
		if (*p != '\\') {
			*o++ = *p;
			continue;
		}
		p++;
		if (*p == 'u' && strlen(p) >= 5) {
			char hex[5] = {p[1], p[2], p[3], p[4], 0};
			*o++ = (char)strtol(hex, NULL, 16);
			p += 4;
		} else if (*p == 'n') {
			*o++ = ' ';
		} else if (*p) {
			*o++ = *p;
		} else {
			break;
		}
	}
	*o = 0;
	return out;
}

static const char *ssl_error(void)
{
	static char buf[256];
	ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
	return buf;
}

int main(int argc, char **argv)
{
	const char *path = "/api", *patch = NULL;
	int timeout = 30;
	for (int i = 1; i < argc; i++) {
		if (i + 1 < argc && !strcmp(argv[i], "--path"))
			path = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--timeout"))
			timeout = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(argv[i], "--merge-patch"))
			patch = argv[++i];
		else {
			fprintf(stderr, "usage: apicheck [--path /api] [--timeout SECONDS] [--merge-patch JSON]\n");
			return 2;
		}
	}
	const char *host = getenv("KUBERNETES_SERVICE_HOST"), *port = getenv("KUBERNETES_SERVICE_PORT");
	if (!host || !port)
		die("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?)", NULL);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(port))};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("KUBERNETES_SERVICE_HOST is not an IPv4 address", host);
	char *token = slurp(SA_DIR "/token");

	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx || SSL_CTX_load_verify_locations(ctx, SA_DIR "/ca.crt", NULL) != 1)
		die("cannot load " SA_DIR "/ca.crt", ssl_error());
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	/* Both names must be in the certificate: the IP (client-go) and the DNS name. */
	X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
	X509_VERIFY_PARAM_set1_host(param, SERVER_NAME, 0);
	X509_VERIFY_PARAM_set1_ip_asc(param, host);

	int fd = -1;
	time_t end = time(NULL) + timeout;
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		struct timeval tv = {5, 0};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
			break;
		int err = errno;
		close(fd);
		if (time(NULL) >= end) {
			char detail[128];
			snprintf(detail, sizeof detail, "%s:%s: %s", host, port, strerror(err));
			die("cannot connect to the kubernetes Service", detail);
		}
		sleep(1);
	}

	SSL *ssl = SSL_new(ctx);
	SSL_set_fd(ssl, fd);
	SSL_set_tlsext_host_name(ssl, SERVER_NAME);
	if (SSL_connect(ssl) != 1) {
		long v = SSL_get_verify_result(ssl);
		die("TLS handshake failed", v != X509_V_OK ? X509_verify_cert_error_string(v) : ssl_error());
	}
	char req[16384];
	int n;
	if (patch)
		n = snprintf(req, sizeof req,
			     "PATCH %s HTTP/1.1\r\nHost: " SERVER_NAME "\r\nAuthorization: Bearer %s\r\n"
			     "Accept: application/json\r\nContent-Type: application/merge-patch+json\r\n"
			     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
			     path, token, strlen(patch), patch);
	else
		n = snprintf(req, sizeof req,
			     "GET %s HTTP/1.1\r\nHost: " SERVER_NAME "\r\nAuthorization: Bearer %s\r\n"
			     "Accept: application/json\r\nConnection: close\r\n\r\n",
			     path, token);
	if (n >= (int)sizeof req || SSL_write(ssl, req, n) != n)
		die("cannot send the request", ssl_error());
	/* A Status (an error's body) is well under this; a 200's object is cut, which only
	 * the status line matters for. */
	char resp[16384];
	int got = 0, r;
	while (got < (int)sizeof resp - 1 && (r = SSL_read(ssl, resp + got, sizeof resp - 1 - got)) > 0)
		got += r;
	resp[got] = 0;
	int ok = !strncmp(resp, "HTTP/1.1 200 ", 13);
	/* Only an error's Status: a pod's own fields have messages too. */
	char *body = strstr(resp, "\r\n\r\n");
	char *message = body && patch && !ok ? json_message(body) : NULL;
	char *eol = strstr(resp, "\r\n");
	if (eol)
		*eol = 0;
	printf("apicheck: %s https://%s:%s%s (verified as %s and %s, with the service-account token): %s%s%s\n",
	       patch ? "PATCH" : "GET", host, port, path, SERVER_NAME, host, resp, message ? ": " : "",
	       message ? message : "");
	return ok ? 0 : 1;
}
