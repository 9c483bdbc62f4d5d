/*
 * trainer: the test trainer of tests/node's real node.
 *
 * It stands in for a distributed training program and does only what such a program
 * does first: it reads the cluster that trainlet wrote for it, listens on its own
 * advertised address, connects to every peer it was given and exchanges a one-line
 * hello with each, naming both ends. A wrong address fails it: the connection is
 * refused or times out, the hello names another task, or its own advertised address is
 * not on this pod (binding it fails).
 *
 *   trainer [--source auto|tf|torch|jax|hostfile] [--hostfile PATH] [--port N]
 *           [--rank N] [--timeout SECONDS] [--listen-any]
 *
 * Sources (auto: the first present, in this order):
 *   tf        TF_CONFIG {"cluster":{"worker":["10.244.0.5:2222",...]},"task":{"type":
 *             "worker","index":1}}. Full mesh: listens on its own entry, connects to every
 *             other entry, and waits for a hello from each. A task missing from the
 *             cluster (TensorFlow's evaluator) listens on nothing and only connects.
 *   torch     MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE. A star, as in PyTorch's
 *             rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT and waits for every
 *             other rank; the others connect to it.
 *   jax       JAX_COORDINATOR_ADDRESS (host:port), JAX_PROCESS_ID, JAX_NUM_PROCESSES,
 *             what jax.distributed.initialize() is given; or Kubeflow JAXJob's
 *             COORDINATOR_ADDRESS (the host alone), COORDINATOR_PORT, PROCESS_ID,
 *             NUM_PROCESSES. Where both sets are present they must agree. A star around
 *             process 0, like torch.
 *   hostfile  --hostfile PATH, lines "<host> slots=N" in rank order; every host listens
 *             on --port. Full mesh. Its own line: --rank, else RANK, else the one line
 *             whose host is an address of this machine's interfaces.
 *
 * Hosts are numeric addresses, names in /etc/hosts, or names the system resolver finds
 * (getaddrinfo: the pod's resolv.conf, the node's cluster DNS; glibc 2.34 and later has
 * its DNS and files lookups built in, also when linked statically). Its first answer
 * is used.
 *
 * Prints a line for each connection made and accepted, and a final "trainer: ok: ..."
 * line; exits 0. Any failure or the timeout (default 60 s) prints "trainer: error: ..."
 * and exits 1; a usage error exits 2.
 *
 * The hello protocol: the connecting side sends "hello from <name>\n"; the accepting
 * side checks the name is one it expects and answers "hello from <its name>\n"; the
 * connecting side checks the answer names the task it meant to reach.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PEERS 256
#define NAME_LEN 64

struct peer {
	char name[NAME_LEN]; /* "worker:1", "rank 1", "process 1" */
	char addr[300];      /* host:port as given */
	struct sockaddr_storage sa;
	socklen_t salen;
	int seen; /* its hello arrived (incoming side) */
};

static struct peer out[MAX_PEERS]; /* whom to connect to */
static int nout;
static char expect[MAX_PEERS][NAME_LEN]; /* whose hello to wait for */
static int seen[MAX_PEERS];
static int nexpect, nseen;
static char self[NAME_LEN];
static char self_addr[300]; /* empty: listen nowhere */
static double deadline, started;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "trainer: error: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(code);
}

/* ---- A minimal JSON reader, enough for TF_CONFIG: values become tokens in document
 * order; `next` is the index after a value's subtree, so siblings can be skipped. ---- */
enum { J_OBJ, J_ARR, J_STR, J_NUM, J_LIT };
struct tok {
	int type, size, next, len;
	const char *s;
};
static struct tok tk[1024];
static int ntk;
static const char *jp;

static void ws(void)
{
	while (*jp == ' ' || *jp == '\t' || *jp == '\n' || *jp == '\r')
		jp++;
}

static int jvalue(void)
{
	ws();
	if (ntk == (int)(sizeof tk / sizeof tk[0]))
		return -1;
	int i = ntk++;
	tk[i].size = 0;
	if (*jp == '{' || *jp == '[') {
		char close = *jp == '{' ? '}' : ']';
		tk[i].type = *jp == '{' ? J_OBJ : J_ARR;
		jp++;
		ws();
		if (*jp == close)
			jp++;
		else
			for (;;) {
				if (tk[i].type == J_OBJ) { /* key, then ':' */
					ws();
					if (*jp != '"' || jvalue() < 0)
						return -1;
					ws();
					if (*jp++ != ':')
						return -1;
				}
				if (jvalue() < 0)
					return -1;
				tk[i].size++;
				ws();
				if (*jp == ',') {
					jp++;
					continue;
				}
				if (*jp++ == close)
					break;
				return -1;
			}
	} else if (*jp == '"') {
		tk[i].type = J_STR;
		tk[i].s = ++jp;
		while (*jp && *jp != '"')
			jp += (*jp == '\\' && jp[1]) ? 2 : 1;
		if (*jp != '"')
			return -1;
		tk[i].len = (int)(jp - tk[i].s);
		jp++;
	} else if (*jp == '-' || isdigit((unsigned char)*jp)) {
		char *end;
		tk[i].type = J_NUM;
		tk[i].s = jp;
		strtod(jp, &end);
		jp = end;
		tk[i].len = (int)(jp - tk[i].s);
	} else if (!strncmp(jp, "true", 4) || !strncmp(jp, "null", 4)) {
		tk[i].type = J_LIT;
		jp += 4;
	} else if (!strncmp(jp, "false", 5)) {
		tk[i].type = J_LIT;
		jp += 5;
	} else
		return -1;
	tk[i].next = ntk;
	return i;
}

/* The value of `key` in object token `obj`, or -1. */
static int jget(int obj, const char *key)
{
	if (obj < 0 || tk[obj].type != J_OBJ)
		return -1;
	int k = obj + 1;
	for (int m = 0; m < tk[obj].size; m++) {
		int v = k + 1;
		if (tk[k].len == (int)strlen(key) && !memcmp(tk[k].s, key, tk[k].len))
			return v;
		k = tk[v].next;
	}
	return -1;
}

static void jcopy(int t, char *buf, size_t n)
{
	snprintf(buf, n, "%.*s", tk[t].len, tk[t].s);
}

/* ---- Addresses ---- */

/* host:port (or [v6]:port) to a socket address: numeric, a name in /etc/hosts, or the
 * system resolver's first answer for it. */
static int resolve(const char *hostport, struct sockaddr_storage *sa, socklen_t *len)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	if (!colon || colon == hostport || !colon[1])
		return -1;
	const char *h = hostport;
	size_t hl = colon - hostport;
	if (*h == '[' && hl >= 2 && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl >= sizeof host)
		return -1;
	memcpy(host, h, hl);
	host[hl] = 0;
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port <= 0 || port > 65535)
		return -1;

	char ip[256] = "";
	struct in_addr a4;
	struct in6_addr a6;
	if (inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1)
		snprintf(ip, sizeof ip, "%s", host);
	else { /* /etc/hosts: "<ip> <name> <alias>..." */
		FILE *f = fopen("/etc/hosts", "r");
		char line[512];
		while (f && !*ip && fgets(line, sizeof line, f)) {
			char *save, *first = strtok_r(line, " \t\n", &save);
			if (!first || *first == '#')
				continue;
			for (char *n; (n = strtok_r(NULL, " \t\n", &save)) && *n != '#';)
				if (!strcasecmp(n, host)) {
					snprintf(ip, sizeof ip, "%s", first);
					break;
				}
		}
		if (f)
			fclose(f);
	}
	if (!*ip) { /* the system resolver: the cluster DNS */
		struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
		if (getaddrinfo(host, NULL, &hints, &res) != 0)
			return -1;
		const void *src = res->ai_family == AF_INET
					  ? (const void *)&((struct sockaddr_in *)res->ai_addr)->sin_addr
					  : (const void *)&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr;
		inet_ntop(res->ai_family, src, ip, sizeof ip);
		freeaddrinfo(res);
	}
	memset(sa, 0, sizeof *sa);
	if (inet_pton(AF_INET, ip, &a4) == 1) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		s->sin_family = AF_INET;
		s->sin_port = htons((unsigned short)port);
		s->sin_addr = a4;
		*len = sizeof *s;
	} else if (inet_pton(AF_INET6, ip, &a6) == 1) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons((unsigned short)port);
		s->sin6_addr = a6;
		*len = sizeof *s;
	} else
		return -1;
	return 0;
}

static const char *fmt_addr(const struct sockaddr_storage *sa, char *buf, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)sa;
		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof ip);
		port = ntohs(s->sin_port);
		snprintf(buf, n, "%s:%d", ip, port);
	} else {
		const struct sockaddr_in6 *s = (const void *)sa;
		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof ip);
		port = ntohs(s->sin6_port);
		snprintf(buf, n, "[%s]:%d", ip, port);
	}
	return buf;
}

static void add_out(const char *name, const char *addr)
{
	if (nout == MAX_PEERS)
		die(1, "more than %d peers", MAX_PEERS);
	struct peer *p = &out[nout++];
	snprintf(p->name, sizeof p->name, "%s", name);
	snprintf(p->addr, sizeof p->addr, "%s", addr);
	if (resolve(addr, &p->sa, &p->salen) < 0)
		die(1, "cannot resolve %s's address %s (numeric, /etc/hosts or DNS)", name, addr);
}

static void add_expect(const char *name)
{
	if (nexpect == MAX_PEERS)
		die(1, "more than %d peers", MAX_PEERS);
	snprintf(expect[nexpect++], NAME_LEN, "%s", name);
}

/* ---- Sources: each fills self, self_addr, out[] and expect[] ---- */

static void from_tf(void)
{
	const char *env = getenv("TF_CONFIG");
	if (!env)
		die(1, "--source tf: TF_CONFIG is not set");
	jp = env;
	int root = jvalue();
	int cluster = jget(root, "cluster"), task = jget(root, "task");
	int type = jget(task, "type"), index = jget(task, "index");
	if (root < 0 || cluster < 0 || tk[cluster].type != J_OBJ || type < 0 || tk[type].type != J_STR ||
	    index < 0 || tk[index].type != J_NUM)
		die(1, "TF_CONFIG is not {\"cluster\":{...},\"task\":{\"type\":...,\"index\":N}}: %s", env);
	char mytype[48], num[32];
	jcopy(type, mytype, sizeof mytype);
	jcopy(index, num, sizeof num);
	snprintf(self, sizeof self, "%s:%d", mytype, atoi(num));

	int k = cluster + 1, type_listed = 0;
	for (int m = 0; m < tk[cluster].size; m++) {
		int list = k + 1;
		char tname[48];
		jcopy(k, tname, sizeof tname);
		type_listed |= !strcmp(tname, mytype);
		if (tk[list].type != J_ARR)
			die(1, "TF_CONFIG: cluster.%s is not a list", tname);
		int e = list + 1;
		for (int i = 0; i < tk[list].size; i++) {
			char name[NAME_LEN], addr[300];
			snprintf(name, sizeof name, "%s:%d", tname, i);
			jcopy(e, addr, sizeof addr);
			if (!strcmp(name, self))
				snprintf(self_addr, sizeof self_addr, "%s", addr);
			else {
				add_out(name, addr);
				add_expect(name);
			}
			e = tk[e].next;
		}
		k = tk[list].next;
	}
	/* Its type not in the cluster (an evaluator): it reaches the others, and they do not
	 * wait for it. Its type listed but not its index: TF_CONFIG is wrong. */
	if (!*self_addr && type_listed)
		die(1, "TF_CONFIG: task %s is not in cluster.%s", self, mytype);
	if (!*self_addr)
		nexpect = 0;
}

/* torch and jax: a star around rank 0 at `addr`. */
static void star(const char *what, const char *addr, const char *rank_s, const char *size_s)
{
	if (!addr || !rank_s || !size_s)
		die(1, "--source %s: missing variables (see trainer.c)", what);
	int rank = atoi(rank_s), size = atoi(size_s);
	if (size < 1 || rank < 0 || rank >= size)
		die(1, "--source %s: rank %d of %d is out of range", what, rank, size);
	const char *label = strcmp(what, "jax") ? "rank" : "process";
	snprintf(self, sizeof self, "%s %d", label, rank);
	char zero[NAME_LEN];
	snprintf(zero, sizeof zero, "%s 0", label);
	if (rank == 0) {
		snprintf(self_addr, sizeof self_addr, "%s", addr);
		for (int r = 1; r < size; r++) {
			char name[NAME_LEN];
			snprintf(name, sizeof name, "%s %d", label, r);
			add_expect(name);
		}
	} else
		add_out(zero, addr);
}

static void from_torch(void)
{
	const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
	char addr[300];
	if (!host || !port)
		die(1, "--source torch: MASTER_ADDR and MASTER_PORT must be set");
	snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
	star("torch", addr, getenv("RANK"), getenv("WORLD_SIZE"));
}

/* An unset variable compares equal only to another unset one. */
static int same(const char *a, const char *b)
{
	return a && b ? !strcmp(a, b) : a == b;
}

static void from_jax(void)
{
	const char *jax_addr = getenv("JAX_COORDINATOR_ADDRESS"), *host = getenv("COORDINATOR_ADDRESS");
	const char *id = getenv("JAX_PROCESS_ID"), *n = getenv("JAX_NUM_PROCESSES");
	char kubeflow[300] = "";
	if (host) { /* Kubeflow's: the host alone, the port apart */
		const char *port = getenv("COORDINATOR_PORT");
		if (!port)
			die(1, "--source jax: COORDINATOR_ADDRESS is set but COORDINATOR_PORT is not");
		snprintf(kubeflow, sizeof kubeflow, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
	}
	if (jax_addr && host) {
		if (strcmp(jax_addr, kubeflow) || !same(id, getenv("PROCESS_ID")) ||
		    !same(n, getenv("NUM_PROCESSES")))
			die(1, "--source jax: JAX_COORDINATOR_ADDRESS=%s JAX_PROCESS_ID=%s JAX_NUM_PROCESSES=%s "
			       "disagree with COORDINATOR_ADDRESS:COORDINATOR_PORT=%s PROCESS_ID=%s NUM_PROCESSES=%s",
			    jax_addr, id ? id : "", n ? n : "", kubeflow, getenv("PROCESS_ID") ? getenv("PROCESS_ID") : "",
			    getenv("NUM_PROCESSES") ? getenv("NUM_PROCESSES") : "");
	}
	if (jax_addr)
		star("jax", jax_addr, id, n);
	else
		star("jax", host ? kubeflow : NULL, getenv("PROCESS_ID"), getenv("NUM_PROCESSES"));
}

/* Is this address on one of this machine's interfaces? */
static int is_local(const struct sockaddr_storage *sa)
{
	struct ifaddrs *ifs, *i;
	int found = 0;
	if (getifaddrs(&ifs) < 0)
		return 0;
	for (i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != sa->ss_family)
			continue;
		if (sa->ss_family == AF_INET)
			found = !memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr,
					&((const struct sockaddr_in *)sa)->sin_addr, sizeof(struct in_addr));
		else
			found = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
					&((const struct sockaddr_in6 *)sa)->sin6_addr, sizeof(struct in6_addr));
	}
	freeifaddrs(ifs);
	return found;
}

static void from_hostfile(const char *path, int port, int rank)
{
	char hosts[MAX_PEERS][300];
	int n = 0;
	char line[512];
	FILE *f = fopen(path, "r");
	if (!f)
		die(1, "cannot open hostfile %s: %s", path, strerror(errno));
	if (port <= 0)
		die(2, "--source hostfile needs --port");
	while (fgets(line, sizeof line, f)) {
		char host[256];
		if (sscanf(line, "%255s", host) != 1 || host[0] == '#')
			continue;
		if (n == MAX_PEERS)
			die(1, "more than %d hosts in %s", MAX_PEERS, path);
		snprintf(hosts[n++], sizeof hosts[0], strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
	}
	fclose(f);
	if (n == 0)
		die(1, "hostfile %s lists no hosts", path);
	if (rank < 0 && getenv("RANK"))
		rank = atoi(getenv("RANK"));
	if (rank < 0) { /* the one line that is an address of this machine */
		for (int i = 0; i < n; i++) {
			struct sockaddr_storage sa;
			socklen_t len;
			if (resolve(hosts[i], &sa, &len) == 0 && is_local(&sa)) {
				if (rank >= 0)
					die(1, "lines %d and %d of %s are both this machine: pass --rank", rank + 1, i + 1, path);
				rank = i;
			}
		}
		if (rank < 0)
			die(1, "no line of %s is an address of this machine: pass --rank", path);
	}
	if (rank >= n)
		die(1, "rank %d, but %s lists %d hosts", rank, path, n);
	snprintf(self, sizeof self, "rank %d", rank);
	snprintf(self_addr, sizeof self_addr, "%s", hosts[rank]);
	for (int i = 0; i < n; i++)
		if (i != rank) {
			char name[NAME_LEN];
			snprintf(name, sizeof name, "rank %d", i);
			add_out(name, hosts[i]);
			add_expect(name);
		}
}

/* ---- The hello exchange ---- */

/* Reads one line (without its newline) with the socket's receive timeout. */
static int read_line(int fd, char *buf, size_t n)
{
	size_t i = 0;
	while (i + 1 < n) {
		char c;
		ssize_t r = read(fd, &c, 1);
		if (r <= 0)
			return -1;
		if (c == '\n')
			break;
		buf[i++] = c;
	}
	buf[i] = 0;
	return 0;
}

static void set_timeouts(int fd, int seconds)
{
	struct timeval tv = {seconds, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int listen_fd = -1;

/* The accepting side, on its own thread: answers every hello, counts the expected ones. */
static void *acceptor(void *arg)
{
	(void)arg;
	for (;;) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof from;
		int fd = accept(listen_fd, (struct sockaddr *)&from, &flen);
		if (fd < 0)
			continue;
		char line[256], buf[64], reply[NAME_LEN + 16];
		set_timeouts(fd, 5);
		if (read_line(fd, line, sizeof line) < 0 || strncmp(line, "hello from ", 11)) {
			printf("trainer: %s: ignored a connection from %s that sent no hello\n", self,
			       fmt_addr(&from, buf, sizeof buf));
			close(fd);
			continue;
		}
		const char *name = line + 11;
		snprintf(reply, sizeof reply, "hello from %s\n", self);
		if (write(fd, reply, strlen(reply)) != (ssize_t)strlen(reply)) {
			close(fd);
			continue;
		}
		close(fd);
		pthread_mutex_lock(&mu);
		int i;
		for (i = 0; i < nexpect && strcmp(expect[i], name); i++)
			;
		if (i == nexpect)
			printf("trainer: %s: answered %s from %s (not a peer it waits for)\n", self, name,
			       fmt_addr(&from, buf, sizeof buf));
		else if (!seen[i]) {
			seen[i] = 1;
			nseen++;
			printf("trainer: %s: accepted %s from %s\n", self, name, fmt_addr(&from, buf, sizeof buf));
		}
		pthread_mutex_unlock(&mu);
	}
	return NULL;
}

/* One attempt: connect within `wait` seconds, send the hello, read and check the answer.
 * Returns 0, or -1 with `why` set (the caller retries until the deadline). */
static int hello(struct peer *p, double wait, char *why, size_t n)
{
	int fd = socket(p->sa.ss_family, SOCK_STREAM, 0);
	if (fd < 0)
		die(1, "socket: %s", strerror(errno));
	fcntl(fd, F_SETFL, O_NONBLOCK);
	int r = connect(fd, (struct sockaddr *)&p->sa, p->salen);
	if (r < 0 && errno == EINPROGRESS) {
		struct pollfd pf = {fd, POLLOUT, 0};
		int err = 0;
		socklen_t el = sizeof err;
		if (poll(&pf, 1, (int)(wait * 1000)) == 1)
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
		else
			err = ETIMEDOUT;
		errno = err;
		r = err ? -1 : 0;
	}
	if (r < 0) {
		snprintf(why, n, "connect: %s", strerror(errno));
		close(fd);
		return -1;
	}
	fcntl(fd, F_SETFL, 0);
	set_timeouts(fd, 5);
	char msg[NAME_LEN + 16], line[256];
	snprintf(msg, sizeof msg, "hello from %s\n", self);
	if (write(fd, msg, strlen(msg)) != (ssize_t)strlen(msg) || read_line(fd, line, sizeof line) < 0) {
		snprintf(why, n, "connected, but no hello came back");
		close(fd);
		return -1;
	}
	close(fd);
	if (strncmp(line, "hello from ", 11) || strcmp(line + 11, p->name))
		die(1, "%s: %s at %s answered \"%s\": that address is not %s's", self, p->name, p->addr, line,
		    p->name);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: trainer [--source auto|tf|torch|jax|hostfile] [--hostfile PATH] [--port N]\n"
			"               [--rank N] [--timeout SECONDS] [--listen-any]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *source = "auto", *hostfile = NULL;
	int port = 0, rank = -1, listen_any = 0;
	double timeout = 60;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--listen-any"))
			listen_any = 1;
		else if (i + 1 < argc && !strcmp(a, "--source"))
			source = argv[++i];
		else if (i + 1 < argc && !strcmp(a, "--hostfile"))
			hostfile = argv[++i];
		else if (i + 1 < argc && !strcmp(a, "--port"))
			port = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(a, "--rank"))
			rank = atoi(argv[++i]);
		else if (i + 1 < argc && !strcmp(a, "--timeout"))
			timeout = atof(argv[++i]);
		else
			usage();
	}
	if (!strcmp(source, "auto")) {
		if (getenv("TF_CONFIG"))
			source = "tf";
		else if (getenv("MASTER_ADDR"))
			source = "torch";
		else if (getenv("COORDINATOR_ADDRESS") || getenv("JAX_COORDINATOR_ADDRESS"))
			source = "jax";
		else if (hostfile)
			source = "hostfile";
		else
			die(1, "no TF_CONFIG, MASTER_ADDR, COORDINATOR_ADDRESS or --hostfile: nothing to go on");
	}
	if (!strcmp(source, "tf"))
		from_tf();
	else if (!strcmp(source, "torch"))
		from_torch();
	else if (!strcmp(source, "jax"))
		from_jax();
	else if (!strcmp(source, "hostfile") && hostfile)
		from_hostfile(hostfile, port, rank);
	else
		usage();
	started = now();
	deadline = started + timeout;

	/* Listen on its own advertised address: binding it proves the address is this pod's. */
	if (*self_addr) {
		struct sockaddr_storage sa;
		socklen_t len;
		char buf[64];
		if (resolve(self_addr, &sa, &len) < 0)
			die(1, "cannot resolve own address %s", self_addr);
		if (listen_any) { /* the same port on every address */
			if (sa.ss_family == AF_INET)
				((struct sockaddr_in *)&sa)->sin_addr.s_addr = htonl(INADDR_ANY);
			else
				((struct sockaddr_in6 *)&sa)->sin6_addr = in6addr_any;
		}
		int one = 1;
		listen_fd = socket(sa.ss_family, SOCK_STREAM, 0);
		setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(listen_fd, (struct sockaddr *)&sa, len) < 0)
			die(1, "%s: cannot listen on its own address %s: %s%s", self, fmt_addr(&sa, buf, sizeof buf),
			    strerror(errno), errno == EADDRNOTAVAIL ? " (not an address of this pod)" : "");
		if (listen(listen_fd, 128) < 0)
			die(1, "listen: %s", strerror(errno));
		pthread_t t;
		pthread_create(&t, NULL, acceptor, NULL);
		printf("trainer: %s listening on %s, waiting for %d peers\n", self, fmt_addr(&sa, buf, sizeof buf),
		       nexpect);
	}

	for (int i = 0; i < nout; i++) {
		char why[128] = "";
		for (;;) {
			double left = deadline - now();
			if (left <= 0)
				die(1, "%s: could not reach %s at %s within %.0fs: %s", self, out[i].name, out[i].addr,
				    timeout, why);
			if (hello(&out[i], left < 1 ? left : 1, why, sizeof why) == 0)
				break;
			usleep(200 * 1000);
		}
		printf("trainer: %s: connected to %s at %s\n", self, out[i].name, out[i].addr);
	}

	for (;;) {
		pthread_mutex_lock(&mu);
		int done = nseen == nexpect;
		pthread_mutex_unlock(&mu);
		if (done)
			break;
		if (now() >= deadline) {
			pthread_mutex_lock(&mu);
			fprintf(stderr, "trainer: error: %s: within %.0fs, no hello from:", self, timeout);
			for (int i = 0; i < nexpect; i++)
				if (!seen[i])
					fprintf(stderr, " %s", expect[i]);
			fprintf(stderr, "\n");
			exit(1);
		}
		usleep(50 * 1000);
	}
	printf("trainer: ok: %s reached %d peers and was reached by %d in %.2fs\n", self, nout, nexpect,
	       now() - started);
	return 0;
}
