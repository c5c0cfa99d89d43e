//! Pins the fingerprints that earlier builds stored for form and multipart
//! bodies: a record written before must still match its honest retry,
//! whichever parser reads the body now.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method, Uri};
use idem_http::FingerprintPolicy;

const FORM: &str = "application/x-www-form-urlencoded";

/// Form bodies: repeated names, empty values, `+` and escapes, bytes that
/// are not UTF-8, and strings no client writes.
const FORMS: &[&[u8]] = &[
    b"amount=1250&currency=EUR&tag=a&tag=b",
    b"tag=b&tag=a&currency=EUR&amount=1250",
    b"",
    b"a",
    b"a=&b=&=&&&",
    b"==&a==b&a=1=2",
    b"q=caf%C3%A9+cr%C3%A8me&q=%E2%82%AC",
    b"a=%2B&b=+&c=%20&d=%2b",
    b"a=%zz&b=%4&c=%&d=%%41&e=%4g",
    b"a=%ff&b=%fe",
    b"a=%ff%fe&%c3=%c3%a9",
    b"n\xffame=v\xfe&x=\xef\xbf\xbd",
    b"a=%EF%BF%BD",
    b"card%5Bnumber%5D=4242&card%5Bexp%5D=12%2F34&metadata[order]=7",
    b"%61=1&a=2",
    b"a=1;b=2&c=\r\n",
];

/// Multipart bodies under `boundary=XyZ` unless they say otherwise:
/// quoted boundaries, preambles and epilogues, padding, file parts,
/// repeated names, and bodies that are refused (fingerprinted as bytes).
fn multiparts() -> Vec<(&'static str, Vec<u8>)> {
    let cd = |name: &str| format!("Content-Disposition: form-data; name=\"{name}\"");
    let part = |headers: &str, data: &str| format!("--XyZ\r\n{headers}\r\n\r\n{data}\r\n");
    let end = "--XyZ--\r\n";
    let xyz = "multipart/form-data; boundary=XyZ";
    let mut out: Vec<(&str, String)> = vec![
        (xyz, format!("{}{}{end}", part(&cd("b"), "two"), part(&cd("a"), "one"))),
        (xyz, format!("{}{}{end}", part(&cd("a"), "one"), part(&cd("b"), "two"))),
        (xyz, format!("{}{}{end}", part(&cd("t"), "1"), part(&cd("t"), "2"))),
        (xyz, format!("{}{}{end}", part(&cd("t"), "2"), part(&cd("t"), "1"))),
        (xyz, format!("{}{end}", part(&cd("empty"), ""))),
        (
            xyz,
            format!(
                "{}{end}",
                part(
                    "Content-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\nContent-Type: image/png",
                    "\u{89}PNG\r\n\x1a\n"
                )
            ),
        ),
        (
            xyz,
            format!(
                "{}{end}",
                part(
                    "content-disposition: FORM-DATA; NAME=\"f\"; Filename=x.txt; filename*=UTF-8''%C3%A9\r\ncontent-type:text/plain \r\nContent-Transfer-Encoding: base64",
                    "aGk="
                )
            ),
        ),
        (
            xyz,
            format!("{}{end}", part("Content-Disposition: form-data; name=\"a;b\"; filename=\"x\\\"y\"", "z")),
        ),
        (xyz, format!("{}{end}", part(&format!("{}\r\nX-Other: 1", cd("a")), "1"))),
        (xyz, format!("preamble\r\n{}{end}epilogue", part(&cd("a"), "1"))),
        (xyz, format!("--XyZ \t\r\n{}\r\n\r\n1\r\n--XyZ--", cd("a"))),
        (xyz, format!("{}{end}", part(&cd("a"), "\r\n--XyZx\r\n--Xy"))),
        (xyz, "--XyZ--".to_owned()),
        ("multipart/form-data; boundary=\"XyZ\"", format!("{}{end}", part(&cd("a"), "1"))),
        (
            "multipart/form-data; charset=utf-8; boundary=\"a;b c\"",
            format!("--a;b c\r\n{}\r\n\r\n1\r\n--a;b c--\r\n", cd("a")),
        ),
        ("Multipart/Form-Data;BOUNDARY=XyZ", format!("{}{end}", part(&cd("a"), "1"))),
        (xyz, format!("{}{end}", part(&cd("na\u{e9}me"), "v"))),
        // Refused: each one is fingerprinted as its bytes.
        ("multipart/form-data", format!("{}{end}", part(&cd("a"), "1"))),
        (xyz, "nothing".to_owned()),
        (xyz, format!("{}--XyZ", part(&cd("a"), "1"))),
        (xyz, part(&cd("a"), "1")),
        (xyz, format!("--XyZx\r\n{}\r\n\r\n1\r\n{end}", cd("a"))),
        (xyz, format!("{}{end}", part("Content-Disposition: form-data; filename=\"a\"", "1"))),
        (xyz, format!("{}{end}", part("Content-Disposition: attachment; name=\"a\"", "1"))),
        (xyz, format!("{}{end}", part(&format!("{}\r\n folded", cd("a")), "1"))),
        (xyz, format!("{}{end}", part(&format!("{}\r\nContent-Type: a\r\nContent-Type: b", cd("a")), "1"))),
        (xyz, format!("{}{end}", part(&format!("{}\nContent-Type: a", cd("a")), "1"))),
        (xyz, format!("--XyZ\r\n{}\r\n1\r\n{end}", cd("a"))),
        (xyz, format!("{}{end}", part("Content-Disposition: form-data; name=\"a\"; name=\"b\"", "1"))),
        (xyz, format!("x--XyZ\r\n{}", part(&cd("a"), "1") + end)),
        (xyz, format!("{}{end}", part(&format!("{}\r\nBad Name: 1\r\nX-Ctl: \x01", cd("a")), "1"))),
    ];
    let mut bytes: Vec<(&str, Vec<u8>)> =
        out.drain(..).map(|(ct, b)| (ct, b.into_bytes())).collect();
    // A disposition and a part that are not UTF-8.
    let mut latin =
        b"--XyZ\r\nContent-Disposition: form-data; name=\"n\xe9\"\r\n\r\n1\r\n".to_vec();
    latin.extend_from_slice(end.as_bytes());
    bytes.push((xyz, latin));
    let mut binary =
        b"--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\n\r\n\xff\xfe\x00\r\n".to_vec();
    binary.extend_from_slice(end.as_bytes());
    bytes.push((xyz, binary));
    bytes
}

fn fingerprint(policy: &FingerprintPolicy, content_type: &str, body: &[u8]) -> String {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, content_type.parse().unwrap());
    let uri: Uri = "/orders?x=1".parse().unwrap();
    policy
        .fingerprint(&Method::POST, &uri, &headers, &Bytes::copy_from_slice(body))
        .current()
        .to_string()
}

fn policies() -> [FingerprintPolicy; 3] {
    [
        FingerprintPolicy::new(),
        FingerprintPolicy::new().exclude(["/tag", "/b", "/file"]),
        FingerprintPolicy::new().include(["/a", "/q", "/t"]),
    ]
}

/// What earlier builds stored for `FORMS`, in order, under each of `policies()`.
const FORMS_RECORDED: &[[&str; 3]] = &[
    [
        "s3:d61b2a2bf4816a5a3583751cd41ed809274072cf5f2d5a90ae0347b9425d7b2c",
        "s72:9f332bdfd6190a575f13f0987178875f1230785125ba0ef1c73ca4ee7a6e956b",
        "s21:7375ffea6769f9675a47454971a3d7e474bbad023202a0577fd8671cfc09a3e6",
    ],
    [
        "s3:0c6c29263329194c30ae5ccef10d31bafc11be595eca3955d54cf98a71b3b234",
        "s72:9f332bdfd6190a575f13f0987178875f1230785125ba0ef1c73ca4ee7a6e956b",
        "s21:7375ffea6769f9675a47454971a3d7e474bbad023202a0577fd8671cfc09a3e6",
    ],
    [
        "s3:8e974e870d74c20985c27df5b8124f83030bfb27e654013b03654c3909b5da93",
        "s72:ed2941de33e6dc0507dc69dca45b9a50a9a020afca1faa7cf4271c5ff53d9f30",
        "s21:7375ffea6769f9675a47454971a3d7e474bbad023202a0577fd8671cfc09a3e6",
    ],
    [
        "s3:a513d6c08cc728c544a6ef29165b9364804854211d45045714a84efffa4390a1",
        "s72:57a796747fcd954d09fb7a5684c9c4a1ca8029548b828858fbdabb3cc15da07d",
        "s21:95105b09fd75dbc7ce00d587f69572c9bce9d72c30c138fbd25b851f1f4d0713",
    ],
    [
        "s3:f3170c51346fa0bd982d6f7e69d6561647a862e18cc1c5203a7e83cc6ab99507",
        "s72:a7a80858cb2395cdbae9f013f03ab85d09e4b712326689f467408a66c6916c03",
        "s21:95105b09fd75dbc7ce00d587f69572c9bce9d72c30c138fbd25b851f1f4d0713",
    ],
    [
        "s3:1317f68f76ccf218f09aba527ef30cdd1f7bece0e6e0eb97e5d05f8bad184cd0",
        "s72:5e437b6e71f9b53482868caa47231a270568253f46fba0141d4560af5da52d4c",
        "s21:c098a166fbf54e75f7fd4e4dcef8e36fb325b4f3e57413a3a6606d178dbf3c16",
    ],
    [
        "s3:79d79f3bcc1d45a0a5d1d9dd6f6500bd4e122a7ccba08b01577d4fa1b1812536",
        "s72:576ab43d9497f62ce1fa83ccb1a571463b57cbb4f015d8d46fd1b3125e24dd32",
        "s21:87e538936316c72181868b479bc38ba32378a44e66a02885d7debd0b25ff6d79",
    ],
    [
        "s3:1a52a424410ae8bfccd03243e0f723cbb0e0de3d5c9aa59f644a609d4b96f4a2",
        "s72:326c46cb43557c25856864bf2a2d3c91e7c567ea713252c9f155d572bfc052bb",
        "s21:db5a87c1a9ba8870fea3778768ca0843d2afd3c80f448c5c7eee2d20e3a7988f",
    ],
    [
        "s3:e8d8f7876f02cbb36dfafb2c97edafa0ade58f2abeb6a34abae10408c38fc476",
        "s72:40dd6fdcf1b2a6fc7948e57bd09537181b3cc8a399090e19a208796809f9d4fd",
        "s21:87a46097475feb4ffea90dcaac334ffd235b05ac8e8a6f0ff7fc05e1515f0fab",
    ],
    [
        "s3:50c64549b154b85c0fced59f095277c26556e46cc3b5d0bbe425678f4bf6c918",
        "s72:d67299044036548879fd6aee263609491718c2caf86c952f83cea9ce5ff30a3f",
        "s21:62f891bbaa97ce9336c612c6221a4f9da565edc12cd7a1919d224d1cc5aa9489",
    ],
    [
        "s3:f24adffcbdfdce583d277544c8a5673c29fa6d39ba882286dffd36f32fbe992e",
        "s72:11baf4ba9a634b72a0d9c4a7216db0939eee0b79af828841af3084a44ac7e745",
        "s21:593c54a476ee3e2e342052076392cc01f017993bddc2e7ab5366b0739e2d908a",
    ],
    [
        "s3:799f318387fc24adc158b71993987f12c54dd4dd53224bd134654e3a76067aa0",
        "s72:caf057f5998ba052e86b8e8d628aef63c05f3b9c812495305461e601ae88c7db",
        "s21:7375ffea6769f9675a47454971a3d7e474bbad023202a0577fd8671cfc09a3e6",
    ],
    [
        "s3:34e5482b6a303a3d943a378068f83fd224374dd1363edd698fd314cc6e0b5e15",
        "s72:404e63c62e10d854f69f5aab08e4d3e768bab55e635bcee8638a882e1fbb72fc",
        "s21:8e102ea86d77df516d322cf5a762ed7c3828274c5a29dd1af89cf4a7dfa3ff2a",
    ],
    [
        "s3:477a4ec75347f2deb1f19920cf4a5cee0e02c6005c37a0e2ee8b2c8c0fcb2011",
        "s72:cb66ff54b48ed1e694dfbe078fd04c3ae6cb9e763af1e35b69719b64f7706f4d",
        "s21:7375ffea6769f9675a47454971a3d7e474bbad023202a0577fd8671cfc09a3e6",
    ],
    [
        "s3:1705b8474c566fb28b8acac751a42824d30c2d142e50e5408b2e3adc35603b44",
        "s72:e0e41ca362e241437d1bfb79b593cb35e91828d8f23f43ef4a917ccb6e3db4c4",
        "s21:c06a021bb779fc838aaf1b55a1ad3dc932570c4b8ca4fa491cd4b4abf1e15d81",
    ],
    [
        "s3:e2f278e5bad06ff67e18e18fb7f64611287ecfe9551021a5d3103394750219bd",
        "s72:79ad4c3b3301dea2593d52cb62586a83be2da08a9a77de22beab5aa901941ef1",
        "s21:57a48851b01006a0e6575d26433c549575bfc1c60255908518805d920db7c338",
    ],
];

/// What earlier builds stored for `multiparts()`, in order, under each of `policies()`.
const MULTIPARTS_RECORDED: &[[&str; 3]] = &[
    [
        "s3:5920770ce6e61993b6be1da6d18681dc0b3865cfb890f656221cfd35bfadc09f",
        "s72:3e88e50fdcf22b84118a530183e915f58574067d5f125ed2cb14d59fd39c27a5",
        "s21:6b4d0bf62912f15f27c7961c01b9588a5a54a0c0491d52a8ab9fa34cb837dde4",
    ],
    [
        "s3:5920770ce6e61993b6be1da6d18681dc0b3865cfb890f656221cfd35bfadc09f",
        "s72:3e88e50fdcf22b84118a530183e915f58574067d5f125ed2cb14d59fd39c27a5",
        "s21:6b4d0bf62912f15f27c7961c01b9588a5a54a0c0491d52a8ab9fa34cb837dde4",
    ],
    [
        "s3:93678966649da5f221c37987587e70bc9712d62806626a6cc9be1102057d8dd5",
        "s72:e911a5bf448ffcac4dab324a8a6260ca3ca1b5b831c867e22e2f4563f8a8c434",
        "s21:8967f7905ca7ba7c1c8842d3934f9b6f4e762f7535cb0b5fbb8d2ac36bd3b1b6",
    ],
    [
        "s3:c04b742e314b80faaff7af68c0a6018c65301f382a9ed7a871bbd87e271a251a",
        "s72:c6921e2a99827ba49f740797b686e36f42c2c5a72d2d13e354c16bc3060b13cc",
        "s21:4ee8c85a0f8cb9fc79ee489ea3bf1b96f3648033181ff46e484676bc7b74265a",
    ],
    [
        "s3:287627b5b4c8b0b062d4a34a61a033715d4f498a6612228fa2f4d9e847a2371f",
        "s72:05e38e081812e4136926fb86748ccb08aa115c78a7644453f5fa1eee7d04f728",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s3:95a2dbd6e07c6b357ea274142912db222c67b55d90cca911c2682dde3dbfee2f",
        "s72:468a3eeb87c6f3ba9d877c9d48ad00555360fe7530377b8be99aa174c5a2c229",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s3:db90609cbd74dd58b3478891a59da571edb550586045f6b76d1f3f09eb57cc77",
        "s72:67298cab442f9ce5474970886c73d077c9c6828552245ef6c946c7a5f8857b75",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s3:4f3f720ba4c9f1471acc09758fc40b35ebde0383be0dd66b95f86e8d76490906",
        "s72:9b36f3b286e3ef3c5f94e8c2324519a9c4fba27fe70ed8209307214b7d16e1a8",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s2:d8e6096d9f134b7b2a5f6fc47b32bfa7d9e91745d26baa934a816cc90ae1399d",
        "s72:625742aacf52c0c78b5d0cbaea424f48cd6900d030b32eeb5d85276e4d577d06",
        "s21:1b3205605f24fda8b63778c04f84a8d4aef56ec1d474e08791857b0319902883",
    ],
    [
        "s3:b8b917de6a7ead44ac0cf6a93a78cd145acf40ac949adbcc8ec215b95a3ef36e",
        "s72:468a3eeb87c6f3ba9d877c9d48ad00555360fe7530377b8be99aa174c5a2c229",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s3:cdee7961efc3b838220fdd6d5676e95b46c10a732ed4edd42a3fff4ae46c8f6c",
        "s72:ddea1031357beacdf9f36bcfc1927e244627cfb93183f86b1c5d7d4599f73c98",
        "s21:dcd533a271117f162280f9229201de7b9572bab89ac5aeb23a764991de33fd6b",
    ],
    [
        "s3:c395a733e498bc69b0ff47e637623c58773b855fd8571efbe40a9c43cb9f0b57",
        "s72:e19330c29c8672997441d63a7d50c8f9caf3053a927a796c173592bd48c32d64",
        "s21:4fcd36c9e9b5b260abc58a803b1776c0e605c05d786a02dcec64e92864b8f15f",
    ],
    [
        "s3:a8ab1865969c807f5e9595df27850f7bad62e7a45bbe441a1f43d3c831c24f0d",
        "s72:c99932381a0a14a79b66831411bbbf22c28f464a46fa820adc65074be285efd4",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
    [
        "s2:46f34f92aed68c7ac2d0b4d1ea7949eb49adf2d6151067613d5a15f84a387171",
        "s72:148f4a712d4d1b16fd64d8d08728b3d746d6c52abaec8381708d2745dc8d771a",
        "s21:10356249cd2f7a8c128bb0abee84fc5c0ac187f9cda14255479b1e9010da3cdd",
    ],
    [
        "s2:2b8e33c89c56a6a51ceae13f0fcbc371b65c20e0609e6d2cb8d7f4e80055fb5b",
        "s72:6f963ff06ff462197c4c4574636a56e3d7d4c7e41fe6edf2ce4f07d518e33464",
        "s21:53e25969c4e0a4af6d8424cdbda2b2c34e6b02443a7ae7fc3026d6bfbc09b2e3",
    ],
    [
        "s2:245cbee14c363edc420a35130e253000a8d5badcdf76be4fc3455decc61968fd",
        "s72:99032b184575c7e3fc40eb1fab15ba81bffe0d7b9c93cb98fc0056c8bcdd20ce",
        "s21:19de829b4eadc4522b9af4be62f612719e4aa12b50f3b2aa23d732b61faf4323",
    ],
    [
        "s2:9addc8514238786aa4b7d823dee6caa053c13f35afef31330042d4771864e523",
        "s72:c6b39ed99eeb78de4bd13daabef45a6aac5dc9e7d6fdedb2c7f525dc93f397a9",
        "s21:990fd10479a1ca06580db83e721c25ce704d7d49116bd952d1299ee5d74a9f78",
    ],
    [
        "s2:e6102343ecd0092ff7984e15e8a52f0cfd56d1694f6cff4333e7ebd5f972d6b2",
        "s72:33e9f08e4f53ede91ddbf060f19dc0568bbdd2c04422bb6bb0d340e5a04da64f",
        "s21:7bc2dbe08ba721600711ed5abec14405722eb79610db041017fbf70ce104c2a5",
    ],
    [
        "s2:0a8470919f7f2b90dd4285930775ce5a9961fbdcf4cb0021805fbb44ff4bfb0e",
        "s72:ee30e622a2e9474470c09bb75e20443716407483950bab76aaaaf3b6388ca238",
        "s21:abeb9e9241b64c092b7897255b53d0b4bcbbe06bcddf832dc4f4148cdb1ccb86",
    ],
    [
        "s2:7368032658ffb2ba1ab461ab0f5c6ef44ed89620147628b3b48f885e3affae95",
        "s72:fd61d01f19d3fd7a7f76b057b81de9d63e669bff4dad79836dbbe5fabef20f4c",
        "s21:a2f5d5609946850c8ec2c8ac1e2006749c9ae0f688332ee04126e022be08408d",
    ],
    [
        "s2:0cbea10b90abe9aec187637294ac59dcb5577d25e5509eb0a356d43332e27cb2",
        "s72:fe950107805c0b580e3c80daf55a165d7dc3f3255538f0800e99e0ff8aadd07e",
        "s21:16ca56469aa926fe99d9f87d48c33b84aef8440104f7454b299a47e1d69592a2",
    ],
    [
        "s2:147f416a441d463c60883848de85427409ee2babb9fd64459fb0c40be5b78f3f",
        "s72:89c51b7eda434620553b8d5c9c0206ab23f0dc7554dc6b8c5a5715b6f596e638",
        "s21:f036be896176d3018d519a6ecd7d6713d97505f2754b9c6fd5a2d1fc6803502d",
    ],
    [
        "s2:a62bf6df820e5d31a4f51ed98353b3806bc59165a200d82ead1c798c21ef3593",
        "s72:a4e92c1b014ba7e91eefea98fc9ca294e4999b9384289517154ea4a483b2e921",
        "s21:dc4072ad173876f355b869735f8de4b12a267d2219e359a112eeeeef5c6dbad1",
    ],
    [
        "s2:e76e10500b6ae52dc46d56150f80ece943b761cb1ad914db4fefbac72791bd5a",
        "s72:892657b99fe1452cd6acbb5fd5a6dd3958f105248be8a3243414c3a479cda947",
        "s21:17ee3c311c86fda50532f3eb1489c35475ad87d04d049557d9325bff01014f94",
    ],
    [
        "s2:6f7b50973e4ef03d0d6171c5980acd89fe96ee92d8a885a5f50a7e171daba253",
        "s72:33cbf9e9306c57dffeb69cb94b0a4cbb560a1aeb889a6e88f986316df1910799",
        "s21:09eb7aabf8f542087d44c5726a829e4d8100eab9b05269a969a585cdd98194da",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s3:cce88891a7fb716f8f94cf7c1b442090955fbcb8f15484ba4acd9994fe40a986",
        "s72:99e7ac3c438a30fef7d190dd69affa323ad60d0a4fcf7d30ec3dd69c41ad3a88",
        "s21:f4a23ccbb296ee6d680c515debe57b4f3f494721678a4a97550308d50aa7cbb1",
    ],
    [
        "s2:eb959fe093774309446a09630e54e6bd76feb59a78366f0efc59f90353e4353d",
        "s72:d322b267fca291a3b1ed9d7cbba680c3a8b2ef983683d0435d3e0a8b487acbc4",
        "s21:a16d60d03ac6d932bede3e79df6d49e53c2fe3d79ee468fb3c5edf3a4a052885",
    ],
    [
        "s3:919b0167de9845dfad24e6d1f0d50a5ef6c2abe2ee17f2ea2ea5fdb134937c68",
        "s72:468a3eeb87c6f3ba9d877c9d48ad00555360fe7530377b8be99aa174c5a2c229",
        "s21:30d0c1c74da5bbad22a186d585f223c5ac33602831846a7efcaecb1c73171a91",
    ],
];

#[test]
fn form_bodies_keep_the_fingerprints_earlier_builds_stored() {
    assert_eq!(FORMS.len(), FORMS_RECORDED.len());
    for (body, recorded) in FORMS.iter().zip(FORMS_RECORDED) {
        for (policy, recorded) in policies().iter().zip(recorded) {
            assert_eq!(
                fingerprint(policy, FORM, body),
                *recorded,
                "{:?} under {policy:?}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

#[test]
fn multipart_bodies_keep_the_fingerprints_earlier_builds_stored() {
    let bodies = multiparts();
    assert_eq!(bodies.len(), MULTIPARTS_RECORDED.len());
    for ((content_type, body), recorded) in bodies.iter().zip(MULTIPARTS_RECORDED) {
        for (policy, recorded) in policies().iter().zip(recorded) {
            assert_eq!(
                fingerprint(policy, content_type, body),
                *recorded,
                "{:?} under {policy:?}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
